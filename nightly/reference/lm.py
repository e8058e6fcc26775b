"""Tiny random causal language-model cases: Llama, Mistral, Qwen2, Qwen3.

Each spec names one feature a port can get wrong (GQA/MHA/MQA, tied embeddings,
head_dim != hidden/heads, each rope type, biases, sliding window, left padding, bf16)
and keeps everything else small so the whole fixture set stays a few megabytes.

The building, greedy seed search and case assembly here are shared with other causal-LM
families (gpt2.py): a spec's `family` says which base config it starts from, which modules'
outputs are recorded and what its position ids mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import transformers

from common import TORCH_DTYPES, Case, TensorSpec, cast_as_loaded, randomize_parameters

VOCAB = 256
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
NEW_TOKENS = 20
# Smallest gap between the best and second-best greedy candidate that a case accepts.
# Below it, a port's legitimate rounding differences could flip a token, so the
# generator moves on to the next seed. bf16's gap is about two ulps at magnitude 1.
MIN_MARGIN = {"f32": 1e-3, "bf16": 1.6e-2, "f16": 4e-3}
# The same for a router's choice: the gap between the k-th and (k+1)-th router logit of
# every routed token (prompt and generation), relative to max(1, |logit|). A flipped choice
# swaps a whole expert's contribution; bf16 asks for two ulps.
MIN_ROUTER_GAP = {"f32": 1e-4, "bf16": 2 ** -6, "f16": 2 ** -9}
SEED_TRIES = 200
SEED_STRIDE = 1000

# Shared by every spec unless it overrides a field.
BASE_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
}


def decoder_points(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Llama-style `model.embed_tokens`, `model.layers.N`, `model.norm` (the final norm last)."""
    points = {"model.embed_tokens": model.model.embed_tokens}
    for i, layer in enumerate(model.model.layers):
        points[f"model.layers.{i}"] = layer
    points["model.norm"] = model.model.norm
    return points


@dataclass(frozen=True)
class LmFamily:
    """What differs between causal-LM families in how a case is built and recorded."""

    base_config: dict[str, Any]
    # Module path -> module whose output is recorded; the last entry is the final norm,
    # whose output is stored as `last_hidden_state`.
    points: Callable[[torch.nn.Module], dict[str, torch.nn.Module]]
    position_meaning: str
    # Mixture-of-experts families: the routers whose top-k choice a case must not leave to
    # rounding (see `routing_gap`).
    routers: Callable[[torch.nn.Module], list[torch.nn.Module]] | None = None
    # Applied to the f32 model after its parameters are randomized.
    adjust: Callable[[torch.nn.Module], None] | None = None


LLAMA_FAMILY = LmFamily(BASE_CONFIG, decoder_points,
                        "rope positions used for logits/activations: cumsum(mask)-1, 0 on padding")


@dataclass
class LmSpec:
    """One causal-LM case: architecture, config overrides and the shape of its prompt batch."""

    name: str
    architecture: str
    description: str
    features: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "f32"
    seed: int = 0
    prompt_len: int = 10
    left_pad: int = 0  # pad tokens before the second prompt of the batch
    weight_std: float = 0.1
    family: LmFamily = LLAMA_FAMILY
    # False writes transformers' in-memory layout (fused `mlp.experts.gate_up_proj`) instead
    # of the checkpoint's original one (`save_pretrained(save_original_format=False)`).
    save_original_format: bool = True
    # transformers' experts kernel for MoE families (None: the library's default, grouped_mm,
    # which needs each expert's rows 16-byte aligned; "eager" loops over the experts).
    experts_implementation: str | None = None


def _rope(rope_type: str, **params: Any) -> dict[str, Any]:
    return {"rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0, **params}}


SPECS: list[LmSpec] = [
    LmSpec("llama-gqa-f32", "LlamaForCausalLM", "GQA (4 query heads, 2 kv heads), untied, left-padded batch",
           ["gqa", "untied", "rope:default", "left-padding"], seed=101, left_pad=3),
    LmSpec("llama-mha-tied-f32", "LlamaForCausalLM", "MHA (4 heads, 4 kv heads), tied embeddings",
           ["mha", "tied", "rope:default"], {"num_key_value_heads": 4, "tie_word_embeddings": True}, seed=102),
    LmSpec("llama-mqa-headdim-f32", "LlamaForCausalLM", "MQA (1 kv head), head_dim 16 != hidden/heads = 8",
           ["mqa", "head-dim", "untied", "rope:default"], {"num_key_value_heads": 1, "head_dim": 16}, seed=103),
    LmSpec("llama-rope-linear-f32", "LlamaForCausalLM", "linear rope scaling, factor 2",
           ["gqa", "rope:linear"], _rope("linear", factor=2.0), seed=104),
    LmSpec("llama-rope-dynamic-f32", "LlamaForCausalLM",
           "dynamic NTK rope, factor 2, max_position_embeddings 16: the prompt (12) fits, generation runs past it",
           ["gqa", "rope:dynamic"], {"max_position_embeddings": 16, **_rope("dynamic", factor=2.0)},
           seed=105, prompt_len=12),
    LmSpec("llama-rope-dynamic-long-f32", "LlamaForCausalLM",
           "dynamic NTK rope, factor 2, max_position_embeddings 16 and a 20-token prompt: the full forward is scaled too",
           ["gqa", "rope:dynamic", "left-padding"], {"max_position_embeddings": 16, **_rope("dynamic", factor=2.0)},
           seed=111, prompt_len=20, left_pad=2),
    LmSpec("llama-rope-llama3-f32", "LlamaForCausalLM",
           "llama3 rope, factor 8, original context 64; head_dim 16 puts frequencies in all three bands",
           ["gqa", "head-dim", "rope:llama3"],
           {"head_dim": 16, "max_position_embeddings": 256,
            **_rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)}, seed=106),
    LmSpec("llama-rope-yarn-f32", "LlamaForCausalLM", "yarn rope, factor 4, original context 16",
           ["gqa", "rope:yarn"], {"max_position_embeddings": 64,
                                  **_rope("yarn", factor=4.0, original_max_position_embeddings=16)}, seed=107),
    LmSpec("llama-bias-f32", "LlamaForCausalLM", "attention_bias and mlp_bias on, left-padded batch",
           ["gqa", "attention-bias", "mlp-bias", "left-padding"], {"attention_bias": True, "mlp_bias": True},
           seed=108, left_pad=2),
    LmSpec("llama-gqa-bf16", "LlamaForCausalLM", "GQA in bfloat16, left-padded batch",
           ["gqa", "untied", "rope:default", "left-padding", "bf16"], dtype="bf16", seed=109, left_pad=3),
    LmSpec("llama-gqa-f16", "LlamaForCausalLM", "GQA in float16, left-padded batch",
           ["gqa", "untied", "rope:default", "left-padding", "f16"], dtype="f16", seed=110, left_pad=3),
    LmSpec("mistral-swa-f32", "MistralForCausalLM",
           "sliding window 8 over a 12-token prompt and 20 new tokens, hidden 64, left-padded batch",
           ["gqa", "sliding-window", "left-padding"],
           {"sliding_window": 8, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 8,
            "head_dim": 8}, seed=201, prompt_len=12, left_pad=3),
    LmSpec("mistral-mqa-tied-f32", "MistralForCausalLM", "MQA, head_dim 16, tied, sliding window 6",
           ["mqa", "head-dim", "tied", "sliding-window"],
           {"sliding_window": 6, "num_key_value_heads": 1, "head_dim": 16, "tie_word_embeddings": True}, seed=202),
    LmSpec("mistral-swa-bf16", "MistralForCausalLM", "sliding window 8 in bfloat16",
           ["gqa", "sliding-window", "bf16"], {"sliding_window": 8, "head_dim": 8}, dtype="bf16", seed=203,
           prompt_len=12),
    LmSpec("qwen2-qkvbias-tied-f32", "Qwen2ForCausalLM", "q/k/v projection biases, GQA, tied, left-padded batch",
           ["gqa", "qkv-bias", "tied", "left-padding"], {"tie_word_embeddings": True}, seed=301, left_pad=4),
    LmSpec("qwen2-mha-theta-f32", "Qwen2ForCausalLM", "MHA, untied, rope_theta 1e6",
           ["mha", "qkv-bias", "untied"],
           {"num_key_value_heads": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, seed=302),
    LmSpec("qwen2-qkvbias-bf16", "Qwen2ForCausalLM", "q/k/v biases in bfloat16",
           ["gqa", "qkv-bias", "bf16"], dtype="bf16", seed=303),
    LmSpec("qwen3-qknorm-tied-f32", "Qwen3ForCausalLM", "q/k RMSNorm, head_dim 16 != 8, GQA, tied, left-padded batch",
           ["gqa", "qk-norm", "head-dim", "tied", "left-padding"], {"head_dim": 16, "tie_word_embeddings": True},
           seed=401, left_pad=2),
    LmSpec("qwen3-mha-bias-f32", "Qwen3ForCausalLM", "q/k RMSNorm with attention_bias, MHA, head_dim 8",
           ["mha", "qk-norm", "attention-bias"], {"num_key_value_heads": 4, "head_dim": 8, "attention_bias": True},
           seed=402),
    LmSpec("qwen3-mqa-yarn-f32", "Qwen3ForCausalLM", "q/k RMSNorm, MQA, yarn rope factor 2",
           ["mqa", "qk-norm", "rope:yarn"],
           {"num_key_value_heads": 1, "head_dim": 8, **_rope("yarn", factor=2.0, original_max_position_embeddings=32)},
           seed=403),
    LmSpec("qwen3-qknorm-bf16", "Qwen3ForCausalLM", "q/k RMSNorm in bfloat16, left-padded batch",
           ["gqa", "qk-norm", "head-dim", "bf16", "left-padding"], {"head_dim": 16}, dtype="bf16", seed=404,
           left_pad=3),
    LmSpec("llama-seqcls-f32", "LlamaForSequenceClassification",
           "transformers' generic sequence head: score (no bias) at each row's rightmost non-padding token, "
           "a right-padded row, positions 0..T", ["gqa", "head:sequence-classification", "right-padding"],
           seed=120, prompt_len=8),
    LmSpec("qwen3-embedder-f32", "Qwen3Model",
           "Qwen3Model as the decoder embedders run it (feature extraction): the whole batch, a right-padded "
           "row, positions 0..T", ["gqa", "qk-norm", "feature-extraction", "right-padding"],
           {"head_dim": 16}, seed=122, prompt_len=8),
    LmSpec("llama-tokcls-f32", "LlamaForTokenClassification",
           "transformers' generic token head: score (with bias) on every token, a right-padded row",
           ["gqa", "head:token-classification", "right-padding"], seed=121, prompt_len=8),
]


def build_model(spec: LmSpec) -> torch.nn.Module:
    """Builds the random model in f32, then casts it to the case dtype."""
    model_cls = getattr(transformers, spec.architecture)
    config = model_cls.config_class(**{**spec.family.base_config, **spec.config})
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)  # only the library's own init reads the global RNG
    extra = {"experts_implementation": spec.experts_implementation} if spec.experts_implementation else {}
    model = model_cls._from_config(config, attn_implementation="eager", dtype=torch.float32, **extra)
    randomize_parameters(model, spec.seed, spec.weight_std)
    if spec.family.adjust:
        spec.family.adjust(model)
    model = cast_as_loaded(model, TORCH_DTYPES[spec.dtype])
    model.config.dtype = TORCH_DTYPES[spec.dtype]
    return model


def make_inputs(spec: LmSpec) -> dict[str, torch.Tensor]:
    """Two prompts of random ids (never pad/bos/eos); the second one left-padded if asked."""
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    vocab = {**spec.family.base_config, **spec.config}.get("vocab_size", VOCAB)
    ids = torch.randint(3, vocab, (2, spec.prompt_len), generator=gen, dtype=torch.int64)
    mask = torch.ones_like(ids)
    if spec.left_pad:
        ids[1, : spec.left_pad] = PAD_ID
        mask[1, : spec.left_pad] = 0
    # Positions as transformers' generate derives them: real tokens count from 0.
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def run_forward(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], points: dict[str, torch.nn.Module]
) -> dict[str, torch.Tensor]:
    """Logits plus the output of every module in `points` (embeddings, each layer, final norm)."""
    captured: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(_capture(captured, f"{name}.output")) for name, module in points.items()]
    try:
        with torch.no_grad():
            logits = model(**inputs, use_cache=False).logits
    finally:
        for hook in hooks:
            hook.remove()
    return {"logits": logits, **captured}


def _capture(store: dict[str, torch.Tensor], name: str):
    def hook(_module, _args, output):
        store[name] = output[0] if isinstance(output, tuple) else output

    return hook


def run_greedy(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """20 greedy tokens, the raw logits of each step and each step's top-1/top-2 gap."""
    with torch.no_grad():
        out = model.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
        )
    new_ids = out.sequences[:, inputs["input_ids"].shape[1]:]
    step_logits = torch.stack(out.logits, dim=1)
    scores = torch.stack(out.scores, dim=1).float()
    top2 = scores.topk(2, dim=-1).values
    return new_ids, step_logits, top2[..., 0] - top2[..., 1]


class routing_gap:
    """Records the smallest relative gap between the k-th and (k+1)-th logit that the given
    routers (modules returning `(router_logits, ...)` with `top_k` and `num_experts`) see."""

    def __init__(self, routers: list[torch.nn.Module]):
        self.routers = routers
        self.gap = float("inf")
        self.hooks: list[Any] = []

    def __enter__(self) -> "routing_gap":
        def hook(module, _args, output):
            top = output[0].float().topk(module.top_k + 1, dim=-1).values
            scale = top[:, -2].abs().clamp(min=1.0)
            self.gap = min(self.gap, float(((top[:, -2] - top[:, -1]) / scale).min()))

        self.hooks = [r.register_forward_hook(hook) for r in self.routers if r.top_k < r.num_experts]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.hooks:
            h.remove()


def pick_seed(spec: LmSpec) -> tuple[LmSpec, torch.nn.Module, dict[str, torch.Tensor], tuple]:
    """The first seed (spec.seed, +1000, +2000, ...) whose greedy path has no near-tie, in
    its tokens or in any router's choice."""
    for attempt in range(SEED_TRIES):
        candidate = replace(spec, seed=spec.seed + attempt * SEED_STRIDE)
        model = build_model(candidate)
        inputs = make_inputs(candidate)
        routers = spec.family.routers(model) if spec.family.routers else []
        with routing_gap(routers) as routing:
            greedy = run_greedy(model, inputs)
        if float(greedy[2].min()) >= MIN_MARGIN[spec.dtype] and routing.gap >= MIN_ROUTER_GAP[spec.dtype]:
            return candidate, model, inputs, greedy
    raise RuntimeError(f"{spec.name}: no seed in {SEED_TRIES} tries has a greedy margin >= {MIN_MARGIN[spec.dtype]} "
                       f"and a router gap >= {MIN_ROUTER_GAP[spec.dtype]}")


def build_case(spec: LmSpec, out_dir: Path) -> Case:
    """Saves the checkpoint into out_dir and returns the case with its tensors."""
    if head_task(spec.architecture):
        return build_classifier_case(spec, out_dir)
    spec, model, inputs, greedy = pick_seed(spec)
    model.save_pretrained(out_dir, save_original_format=spec.save_original_format)
    # A fresh model for the forward pass: dynamic rope keeps state across calls (the
    # longest sequence seen), so running after generate() would leak its frequencies.
    return case_of(spec, build_model(spec), inputs, greedy)


HEAD_TASKS = {"ForSequenceClassification": "text-classification", "ForTokenClassification": "token-classification",
              "ForQuestionAnswering": "question-answering"}
HEAD_LABELS = ["negative", "neutral", "positive"]


def head_task(architecture: str) -> str | None:
    """The case task of a decoder family's classification class or base model (feature
    extraction, as the decoder embedders run it), None for the causal LMs."""
    if architecture.endswith("Model") and not architecture.endswith("LMHeadModel"):
        return "feature-extraction"
    return next((t for suffix, t in HEAD_TASKS.items() if architecture.endswith(suffix)), None)


def build_classifier_case(spec: LmSpec, out_dir: Path) -> Case:
    """A decoder with transformers' classification head (`*ForSequenceClassification`: the
    rightmost non-padding token through `score`; `*ForTokenClassification`: every token;
    `*ForQuestionAnswering`: every token through `qa_outputs`, a span's start and end scores),
    on two right-padded rows with positions 0..T as transformers gives them."""
    task = head_task(spec.architecture)
    if task in ("text-classification", "token-classification"):
        labels = {"id2label": dict(enumerate(HEAD_LABELS)), "label2id": {n: i for i, n in enumerate(HEAD_LABELS)}}
        spec = replace(spec, config={**labels, **spec.config})
    model = build_model(spec)
    model.save_pretrained(out_dir, save_original_format=spec.save_original_format)
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (2, spec.prompt_len), generator=gen, dtype=torch.int64)
    mask = torch.ones_like(ids)
    pad = spec.left_pad or 2
    ids[1, -pad:] = PAD_ID
    mask[1, -pad:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    base = model if task == "feature-extraction" else getattr(model, model.base_model_prefix)
    # The layers' outputs, named as the causal LM's (a question-answering class may hold its
    # base under another name; a base model's own paths have no prefix).
    holder = type("Holder", (), {"model": base, "transformer": base})()
    points = {k: v for k, v in spec.family.points(holder).items() if k.rsplit(".", 1)[-1].isdigit()}
    if base is model:
        points = {k.split(".", 1)[1]: v for k, v in points.items()}
    elif model.base_model_prefix != "model":
        points = {f"{model.base_model_prefix}.{k[len('model.'):]}" if k.startswith("model.") else k: v
                  for k, v in points.items()}
    captured: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(_capture(captured, f"{n}.output")) for n, m in points.items()]
    keep: dict[str, torch.Tensor] = {}

    def keep_base(_module, _args, output) -> None:
        keep["h"] = output.last_hidden_state

    hooks.append(base.register_forward_hook(keep_base))
    try:
        with torch.no_grad():
            result = model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    per_token = task == "token-classification"
    meaning = ("per-token label scores [batch, seq, labels]: score(last_hidden_state)" if per_token else
               "label scores [batch, labels]: score at each row's rightmost token that is not pad_token_id")
    logits = getattr(result, "logits", None)
    outputs = [] if logits is None else [
        TensorSpec("logits", logits.float(), f"{meaning}; names in config.json id2label{stored_as}",
                   compare="allclose", mask="attention_mask" if per_token else None)]
    for end in ("start", "end") if task == "question-answering" else ():
        outputs.append(TensorSpec(f"{end}_logits", getattr(result, f"{end}_logits").float(),
                                  f"per-token scores of the answer span's {end} [batch, seq]: column "
                                  f"{0 if end == 'start' else 1} of qa_outputs(last_hidden_state){stored_as}",
                                  compare="allclose", mask="attention_mask"))
    outputs.append(TensorSpec("last_hidden_state", keep["h"].float(), f"the base model's output{stored_as}",
                              compare="allclose", mask="attention_mask"))
    for name, value in captured.items():
        outputs.append(TensorSpec(name, value.float(), f"output of module {name[:-7]}{stored_as}",
                                  compare="allclose", mask="attention_mask"))
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type=model.config.model_type,
        task=task,
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=[
            TensorSpec("input_ids", ids, "token ids [batch, seq]; right padding uses pad_token_id"),
            TensorSpec("attention_mask", mask, "1 for a real token, 0 for padding"),
        ],
        outputs=outputs,
    )


def case_of(
    spec: LmSpec,
    fresh: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    greedy: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    checkpoint: dict[str, str] | None = None,
) -> Case:
    """The case of `spec`: `fresh` (a model no forward has run on) gives the forward outputs,
    `greedy` (run_greedy's result) the generation."""
    new_ids, step_logits, margins = greedy
    points = spec.family.points(fresh)
    final_norm = f"{list(points)[-1]}.output"
    forward = run_forward(fresh, inputs, points)
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    outputs = [
        TensorSpec("logits", forward["logits"].float(), f"next-token logits for every input position{stored_as}",
                   compare="allclose", mask="attention_mask"),
        TensorSpec("last_hidden_state", forward[final_norm].float(),
                   f"output of the base model (after {final_norm[:-7]}), what *Model returns{stored_as}",
                   compare="allclose", mask="attention_mask"),
    ]
    for name, value in forward.items():
        if name.endswith(".output") and name != final_norm:
            outputs.append(TensorSpec(name, value.float(), f"output of module {name[:-7]}{stored_as}",
                                      compare="allclose", mask="attention_mask"))
    outputs += [
        TensorSpec("generated_ids", new_ids, f"{NEW_TOKENS} greedy new tokens per prompt (prompt excluded)",
                   compare="exact"),
        TensorSpec("generated_logits", step_logits.float(),
                   f"raw logits of each greedy step, before logits processors [batch, step, vocab]{stored_as}",
                   compare="allclose"),
        TensorSpec("generated_margins", margins.float(),
                   "gap between the best and second-best processed score at each greedy step [batch, step]; "
                   "a port may only disagree on a token where this gap is within its tolerance",
                   compare="info"),
    ]
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type=fresh.config.model_type,
        task="causal-lm",
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=[
            TensorSpec("input_ids", inputs["input_ids"], "token ids [batch, seq]; left padding uses pad_token_id"),
            TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding"),
            TensorSpec("position_ids", inputs["position_ids"], spec.family.position_meaning),
        ],
        outputs=outputs,
        checkpoint=checkpoint or {"path": ".", "format": "safetensors"},
        generation={
            "do_sample": False,
            "max_new_tokens": NEW_TOKENS,
            "min_new_tokens": NEW_TOKENS,
            "pad_token_id": PAD_ID,
            "eos_token_id": EOS_ID,
            "min_top2_margin": float(margins.min()),
        },
    )
