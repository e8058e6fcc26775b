"""Tiny GGUF causal-LM cases: the random checkpoints of other specs written the way llama.cpp's
converter writes them, and what transformers' GGUF loader (`from_pretrained(dir,
gguf_file=...)`) computes from the file.

Each case takes a committed spec's model (same seed search, so the same weights), maps every
tensor to llama.cpp's name with gguf-py's own name map for the architecture, and applies what
llama.cpp's converter does to the tensors: Q/K rows permuted for rope in `llama` files, Gemma's
norm weights stored as `1 + w`, experts stacked per projection (`ffn_gate_exps [E, I, H]`,
transformers' fused `gate_up_proj` split). Metadata holds what llama.cpp writes for the
architecture. Tensors stay F32, so the logits are transformers' on the same values zoo reads.

transformers reads only some metadata keys per architecture and takes its config defaults
for the rest (Gemma 3's local rope base, its sliding pattern, Gemma 2's query scale); the
reference is what it builds, and the specs avoid settings a GGUF file cannot carry to it
(rope scaling on Gemma 3, expert widths other than Qwen's defaults).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import torch
import transformers

import lm
import moe
import gemma
import phi3
from common import Case

FILE = "model.gguf"


@dataclass(frozen=True)
class GgufSpec:
    name: str
    source: lm.LmSpec  # the spec whose model is written
    arch: str  # llama.cpp's general.architecture
    description: str
    # Where the numbers come from: transformers' GGUF loader on the file, or, for files it
    # cannot read (Mixtral written as llama, Gemma 1, Qwen2-MoE with its own expert widths),
    # transformers on the source checkpoint the file was written from (the same weights).
    reference: str = "gguf"


def _by_name(name: str) -> lm.LmSpec:
    for spec in lm.SPECS + phi3.SPECS + gemma.SPECS + moe.SPECS:
        if spec.name == name:
            return spec
    raise KeyError(name)


SPECS: list[GgufSpec] = [
    GgufSpec("gguf-qwen2-f32", _by_name("qwen2-qkvbias-tied-f32"), "qwen2",
             "qwen2 file: q/k/v biases, tied (no output.weight), GQA, left-padded"),
    # transformers reads no head size from qwen3 files and takes Qwen3's 128.
    GgufSpec("gguf-qwen3-f32", lm.LmSpec(
        "gguf-qwen3-f32", "Qwen3ForCausalLM", "qwen3 source", ["gqa", "qk-norm", "head-dim", "tied", "left-padding"],
        {"head_dim": 128, "tie_word_embeddings": True}, seed=1301, left_pad=2), "qwen3",
             "qwen3 file: attn_q_norm/attn_k_norm, head size 128 != hidden/heads, tied, left-padded"),
    GgufSpec("gguf-phi3-f32", _by_name("phi3-fused-f32"), "phi3",
             "phi3 file: fused attn_qkv and ffn_up (gate and up), untied, left-padded"),
    GgufSpec("gguf-gemma2-f32", _by_name("gemma2-softcap-swa-f32"), "gemma2",
             "gemma2 file: 1 + w norms, four norms per layer, soft-caps and sliding window in metadata"),
    GgufSpec("gguf-gemma3-f32", _by_name("gemma3-layertypes-f32"), "gemma3",
             "gemma3 file: 1 + w norms including q/k norms, sliding window in metadata, untied"),
    GgufSpec("gguf-mixtral-f32", _by_name("mixtral-top2-f32"), "llama",
             "Mixtral as llama.cpp writes it: a llama file with expert_count, permuted q/k, stacked experts "
             "(transformers reads such a file as a dense Llama, so the numbers are the source checkpoint's)",
             reference="source"),
    GgufSpec("gguf-gemma-f32", _by_name("gemma-mqa-f32"), "gemma",
             "gemma (1) file: 1 + w norms, MQA, head size 16 (transformers reads no gemma files: numbers of the "
             "source checkpoint)", reference="source"),
    GgufSpec("gguf-qwen2moe-f32", _by_name("qwen2moe-shared-f32"), "qwen2moe",
             "qwen2moe file: stacked experts, shared expert and its gate, expert widths in metadata (transformers "
             "reads no expert width from the file: numbers of the source checkpoint)", reference="source"),
    GgufSpec("gguf-qwen3moe-f32", lm.LmSpec(
        "gguf-qwen3moe-f32", "Qwen3MoeForCausalLM", "qwen3moe source", ["moe"],
        {**moe._qwen(4, 2, norm_topk_prob=True), "moe_intermediate_size": 768, "head_dim": 8},
        seed=1201, family=moe.MOE_FAMILY), "qwen3moe",
             "qwen3moe file: 4 stacked experts of transformers' default width 768, top-2 renormalised"),
]


def _tensors(spec: GgufSpec, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """llama.cpp's tensors for the model: names from gguf-py's map, the converter's changes."""
    cfg = model.config
    state = {}
    for name, t in model.state_dict().items():
        t = t.detach().float().clone()
        if name.endswith("experts.gate_up_proj"):
            i = t.shape[1] // 2
            state[name.replace("gate_up_proj", "gate_proj")] = t[:, :i]
            state[name.replace("gate_up_proj", "up_proj")] = t[:, i:]
        else:
            state[name] = t
    arch = gguf.MODEL_ARCH[spec.arch.upper()]
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    out = {}
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = (name.rsplit(".", 1) + [""])[:2] if name.endswith((".weight", ".bias")) else (name, "")
        mapped = names.get_name(base)
        if mapped is None:
            raise KeyError(f"{spec.name}: gguf-py has no {spec.arch} name for {name}")
        if spec.arch.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1
        if spec.arch == "llama" and base.endswith(("q_proj", "k_proj")):
            heads = cfg.num_attention_heads if base.endswith("q_proj") else cfg.num_key_value_heads
            t = t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
        out[mapped + ("." + suffix if suffix else ".weight")] = t
    return out


def _write(spec: GgufSpec, model: torch.nn.Module, path: Path) -> None:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch=spec.arch)
    w.add_name(f"zoo {spec.name}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    rope = cfg.rope_parameters
    if "full_attention" in rope:
        rope = rope["full_attention"]
    w.add_rope_freq_base(rope["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if spec.arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    if spec.arch == "gemma2":
        w.add_float32(f"{spec.arch}.attn_logit_softcapping", cfg.attn_logit_softcapping)
        w.add_float32(f"{spec.arch}.final_logit_softcapping", cfg.final_logit_softcapping)
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        if getattr(cfg, "moe_intermediate_size", None):
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if getattr(cfg, "shared_expert_intermediate_size", None):
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_bos_token_id(lm.BOS_ID)
    w.add_eos_token_id(lm.EOS_ID)
    w.add_pad_token_id(lm.PAD_ID)
    for name, t in _tensors(spec, model).items():
        w.add_tensor(name, t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _load(out_dir: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        out_dir, gguf_file=FILE, dtype=torch.float32, attn_implementation="eager").eval()


def build_case(spec: GgufSpec, out_dir: Path) -> Case:
    source, model, inputs, greedy = lm.pick_seed(spec.source)
    _write(spec, model, out_dir / FILE)
    if spec.reference == "source":
        fresh = lm.build_model(source)
    else:
        greedy = lm.run_greedy(_load(out_dir), inputs)
        if float(greedy[2].min()) < lm.MIN_MARGIN["f32"]:
            raise RuntimeError(f"{spec.name}: the GGUF model's greedy margin {float(greedy[2].min())} is below "
                               f"{lm.MIN_MARGIN['f32']}; pick another source seed")
        fresh = _load(out_dir)
    case = lm.case_of(source, fresh, inputs, greedy, checkpoint={"path": FILE, "format": "gguf"})
    case.name = spec.name
    case.architecture = fresh.config.architectures[0] if fresh.config.architectures else type(fresh).__name__
    case.description = spec.description
    case.features = sorted(set(source.features) | {"gguf", f"gguf:{spec.arch}"})
    case.seed = source.seed
    return case
