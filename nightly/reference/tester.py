"""Cases on the peers' own test configurations: the tiny configs that transformers' model
tests build (`tests/models/<family>/test_modeling_<family>.py`, their `ModelTester`), read
as data from tester_configs.json (values and the test each comes from; no test code).

BERT (its six heads), the T5/UMT5 encoders and encoder-decoders (greedy generation), ViT (and its classifier) and CLIP's text
and vision towers (and their projections) get their testers' configs too. Each causal-LM family gets its tester's config as transformers' tests construct it (every
field the tester sets, the library's defaults for the rest: gelu MLPs, 2 heads of 16,
intermediate 37, vocabulary 99) and the variants its tests build on purpose (rope scaling
linear/dynamic/yarn with factor 10, GPT-2's attention switches, MoE expert counts, Gemma 3's
sliding window). The inputs, greedy generation and recorded outputs are lm.py's, with the
tester's 7-token sequences.

The sweep (scripts/tester-sweep.sh) writes every case into a cache folder and runs zoo's
parity harness on them; the cases named in COMMITTED are also committed fixtures.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import gemma
import gpt2
import lm
import moe
import phi3
from lm import LmFamily, LmSpec

CONFIGS = json.loads((Path(__file__).resolve().parent / "tester_configs.json").read_text())

# family key in tester_configs.json -> (architecture, the lm.py family whose recording it uses)
CAUSAL: dict[str, tuple[str, LmFamily]] = {
    "llama": ("LlamaForCausalLM", lm.LLAMA_FAMILY),
    "mistral": ("MistralForCausalLM", lm.LLAMA_FAMILY),
    "qwen2": ("Qwen2ForCausalLM", lm.LLAMA_FAMILY),
    "qwen3": ("Qwen3ForCausalLM", lm.LLAMA_FAMILY),
    "mixtral": ("MixtralForCausalLM", moe.MOE_FAMILY),
    "qwen2_moe": ("Qwen2MoeForCausalLM", moe.MOE_FAMILY),
    "qwen3_moe": ("Qwen3MoeForCausalLM", moe.MOE_FAMILY),
    "phi3": ("Phi3ForCausalLM", phi3.PHI3_FAMILY),
    "gemma": ("GemmaForCausalLM", gemma.GEMMA_FAMILY),
    "gemma2": ("Gemma2ForCausalLM", gemma.GEMMA_FAMILY),
    "gemma3": ("Gemma3ForCausalLM", gemma.GEMMA_FAMILY),
    "gpt2": ("GPT2LMHeadModel", gpt2.GPT2_FAMILY),
}

# The head classes the causal-LM tester checks (`sequence_classification_class`,
# `token_classification_class`, `question_answering_class`), by their class-name prefix:
# transformers has the three for Llama, Mistral, Mixtral, Qwen2/3 and their MoE models and
# GPT-2, the classification pair for Phi-3 and Gemma 1/2, and a sequence head only for
# Gemma 3's text model.
SEQ, TOK, QA = "SequenceClassification", "TokenClassification", "QuestionAnswering"
HEADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama": ("Llama", (SEQ, TOK, QA)), "mistral": ("Mistral", (SEQ, TOK, QA)),
    "qwen2": ("Qwen2", (SEQ, TOK, QA)), "qwen3": ("Qwen3", (SEQ, TOK, QA)),
    "mixtral": ("Mixtral", (SEQ, TOK, QA)), "qwen2_moe": ("Qwen2Moe", (SEQ, TOK, QA)),
    "qwen3_moe": ("Qwen3Moe", (SEQ, TOK, QA)), "phi3": ("Phi3", (SEQ, TOK)),
    "gemma": ("Gemma", (SEQ, TOK)), "gemma2": ("Gemma2", (SEQ, TOK)),
    "gemma3": ("Gemma3Text", (SEQ,)), "gpt2": ("GPT2", (SEQ, TOK, QA)),
}
HEAD_SUFFIX = {SEQ: "seqcls", TOK: "tokcls", QA: "qa"}

# The shared tester's rope-scaling test: its scaled parameters over the reference ones.
ROPE_REFERENCE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                  "original_max_position_embeddings": 16384}

# Committed as fixtures (the rest live in the sweep's cache folder).
COMMITTED = ["tester-llama-f32", "tester-gemma2-f32", "tester-qwen2-moe-f32", "tester-gpt2-f32", "tester-llama-qa-f32",
             "tester-bert-f32", "tester-bert-qa-f32", "tester-bert-mc-f32"]


def build_case(spec: Any, out_dir: Path):
    """The family module's own case builder for `spec`."""
    import bert
    import clip
    import seq2seq
    import t5
    import vision

    if isinstance(spec, bert.BertSpec):
        return bert.build_case(spec, out_dir)
    if isinstance(spec, t5.T5Spec):
        return t5.build_case(spec, out_dir)
    if isinstance(spec, seq2seq.Seq2SeqSpec):
        return seq2seq.build_case(spec, out_dir)
    if isinstance(spec, vision.VisionSpec):
        return vision.build_case(spec, out_dir)
    if isinstance(spec, clip.ClipTextSpec):
        return clip.build_case(spec, out_dir)
    return lm.build_case(spec, out_dir)


def _variants(key: str) -> list[tuple[str, str, list[str], dict[str, Any], dict[str, Any]]]:
    """(suffix, description, features, config overrides, spec overrides) of each variant."""
    out = [("", "the tester's config", [], {}, {})]
    if key == "gpt2":
        out += [
            ("scale-inv-layer", "scale_attn_by_inverse_layer_idx (test_gpt2_scale_attn_by_inverse_layer_idx)",
             ["scale-attn-by-inverse-layer-idx"], {"scale_attn_by_inverse_layer_idx": True}, {}),
            ("upcast-reorder", "reorder_and_upcast_attn (test_gpt2_reorder_and_upcast_attn)",
             ["reorder-and-upcast-attn"], {"reorder_and_upcast_attn": True}, {}),
        ]
        return out
    if key == "gemma3":
        # test_generation_beyond_sliding_window_tiny_model's switches on the tester's sizes:
        # a full and a sliding layer, window 8, a prompt and generation past it.
        out.append(("window8", "layer_types full + sliding, sliding_window 8, prompt and generation past it "
                    "(test_generation_beyond_sliding_window_tiny_model)", ["sliding-window", "layer-types"],
                    {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8,
                     "max_position_embeddings": 128}, {"prompt_len": 12}))
        return out
    # Phi-3's config takes longrope alone, so its tester has no rope-scaling variants.
    for rope in () if key == "phi3" else ("linear", "dynamic", "yarn"):
        out.append((f"rope-{rope}", f"rope_type {rope}, factor 10 (test_model_rope_scaling_from_config)",
                    [f"rope:{rope}"], {"rope_parameters": {**ROPE_REFERENCE, "rope_type": rope, "factor": 10.0}}, {}))
    if key == "qwen2_moe":
        out.append(("experts3", "3 experts, top-2 (test_load_balancing_loss)", ["moe"], {"num_experts": 3}, {}))
    return out


def _specs() -> list[LmSpec]:
    specs = []
    for seed, (key, (arch, family)) in enumerate(CAUSAL.items()):
        tester = CONFIGS["transformers"][key]
        base = dict(tester["base"])
        seq = tester.get("inputs", {}).get("seq_length", 7)
        # The tester's config alone: the library's defaults for every field it leaves out.
        bare = replace(family, base_config={})
        for i, (suffix, what, features, config, extra) in enumerate(_variants(key)):
            name = "-".join(p for p in ("tester", key.replace("_", "-"), suffix, "f32") if p)
            kw = {"prompt_len": seq, "left_pad": 2, **extra}
            if key == "gpt2":
                kw["weight_std"] = gpt2.WEIGHT_STD["f32"]
            if family is moe.MOE_FAMILY:
                # The tester's expert width (37, or 12) is no multiple of 4 floats, which
                # torch's grouped_mm refuses on CPU: PyTorch's loop over the experts instead.
                kw["experts_implementation"] = "eager"
            specs.append(LmSpec(name, arch, f"transformers' {arch} tester: {what} ({tester['source']})",
                                ["tester", *features], {**base, **config}, seed=9000 + 100 * seed + i,
                                family=bare, **kw))
        prefix, heads = HEADS[key]
        for j, head in enumerate(heads):
            head_arch = f"{prefix}For{head}"
            name = f"tester-{key.replace('_', '-')}-{HEAD_SUFFIX[head]}-f32"
            kw = {"prompt_len": seq, "left_pad": 2}
            if key == "gpt2":
                kw["weight_std"] = gpt2.WEIGHT_STD["f32"]
            if family is moe.MOE_FAMILY:
                kw["experts_implementation"] = "eager"
            feature = "head:question-answering" if head == QA else f"head:{head[:-len('Classification')].lower()}-classification"
            specs.append(LmSpec(name, head_arch, f"transformers' {head_arch} on the tester's config "
                                f"({tester['source']})", ["tester", feature],
                                base, seed=9050 + 100 * seed + j, family=bare, **kw))
    return specs


def _bare(config_class: type, module_base: dict[str, Any], tester: dict[str, Any]) -> dict[str, Any]:
    """The tester's config over a module whose specs start from `module_base`: every field
    the module sets and the tester does not goes back to the config class's default."""
    defaults = config_class().to_dict()
    return {**{k: defaults[k] for k in module_base if k not in tester and k in defaults}, **tester}


def _encoder_specs() -> list[Any]:
    import bert
    import seq2seq
    import t5
    from transformers import BertConfig, T5Config, UMT5Config

    specs: list[Any] = []
    tester = CONFIGS["transformers"]["bert"]
    config = _bare(BertConfig, bert.BASE_CONFIG, tester["base"])
    seq = tester["inputs"]["seq_length"]
    heads = [("BertModel", "", {}), ("BertForMaskedLM", "mlm", {}),
             ("BertForSequenceClassification", "seqcls", bert.labels("a", "b")),
             ("BertForTokenClassification", "tokcls", bert.labels("a", "b", "c")),
             ("BertForQuestionAnswering", "qa", {}), ("BertForMultipleChoice", "mc", {})]
    for i, (arch, suffix, extra) in enumerate(heads):
        name = "-".join(p for p in ("tester-bert", suffix, "f32") if p)
        specs.append(bert.BertSpec(name, f"transformers' BERT tester config, {arch} ({tester['source']})",
                                   ["tester"], {**config, **extra}, seed=11000 + i, seq_len=seq, right_pad=2,
                                   architecture=arch))
    for i, (key, arch, cls) in enumerate((("t5", "T5EncoderModel", T5Config),
                                          ("umt5", "UMT5EncoderModel", UMT5Config))):
        tester = CONFIGS["transformers"][key]
        config = _bare(cls, t5.BASE_CONFIG, {k: v for k, v in tester["base"].items() if v is not None})
        seq = tester["inputs"]["encoder_seq_length"]
        specs.append(t5.T5Spec(f"tester-{key}-encoder-f32", f"transformers' {arch} tester config "
                               f"({tester['source']})", ["tester"], config, architecture=arch,
                               seed=11100 + i, seq_len=seq, short=4))
        gen_arch = arch.replace("EncoderModel", "ForConditionalGeneration")
        specs.append(seq2seq.Seq2SeqSpec(f"tester-{key}-generate-f32", f"transformers' {gen_arch} tester config, "
                                         f"greedy generation ({tester['source']})", ["tester", "generation"],
                                         _bare(cls, seq2seq.BASE_CONFIG, config), architecture=gen_arch,
                                         seed=11120 + i, seq_len=seq, short=4))
        if key == "t5":
            # test_config_and_model_silu_gated and the v1.1 test: gated feed-forwards.
            for j, proj in enumerate(("gated-gelu", "gated-silu")):
                specs.append(t5.T5Spec(f"tester-t5-encoder-{proj}-f32", f"the T5 tester config with "
                                       f"feed_forward_proj {proj}", ["tester", proj], {**config, "feed_forward_proj": proj},
                                       architecture=arch, seed=11110 + j, seq_len=seq, short=4))
    return specs


def _vision_specs() -> list[Any]:
    import vision
    from transformers import CLIPVisionConfig, ViTConfig

    specs: list[Any] = []
    vit = CONFIGS["transformers"]["vit"]
    clip = CONFIGS["transformers"]["clip"]
    vit_config = _bare(ViTConfig, vision.VIT_CONFIG,
                       {k: v for k, v in vit["base"].items() if k != "attn_implementation"})
    clip_config = _bare(CLIPVisionConfig, vision.CLIP_VISION_CONFIG, clip["base"]["vision"])
    side = vit_config["image_size"]
    import clip as clip_text
    from transformers import CLIPTextConfig

    text = _bare(CLIPTextConfig, clip_text.BASE_CONFIG, clip["base"]["text"])
    # CLIPModelTest: both testers' towers joined with projection_dim 64.
    specs.append(vision.VisionSpec(
        "tester-clip-model-f32", f"transformers' CLIPModel tester config: the text and vision testers' towers, "
        f"projection_dim {clip['base']['clip_model']['projection_dim']}, texts of random ids (no end-of-text "
        f"in the vocabulary) ({clip['source']})", ["tester", "contrastive"], "CLIPModel", clip_config,
        seed=11250, image=(side, side), text_config=_bare(CLIPTextConfig, vision.CLIP_TEXT_CONFIG, clip["base"]["text"]),
        projection_dim=clip["base"]["clip_model"]["projection_dim"], special_ids=False))
    seq = clip["inputs"]["text"]["seq_length"]
    for i, arch in enumerate(("CLIPTextModel", "CLIPTextModelWithProjection")):
        name = "tester-clip-text-f32" if i == 0 else "tester-clip-text-proj-f32"
        specs.append(clip_text.ClipTextSpec(
            name, f"transformers' {arch} tester config: bos/eos ids 49406/49407 outside the 99-id vocabulary, "
            f"so the pooled state is the first token's ({clip['source']})", ["tester", "pooled:first"], text,
            architecture=arch, seed=11300 + i, seq_len=seq, short=4, special_ids=False))
    for i, (arch, config) in enumerate((("ViTModel", vit_config), ("ViTForImageClassification", vit_config),
                                        ("CLIPVisionModel", clip_config),
                                        ("CLIPVisionModelWithProjection", clip_config))):
        source = (vit if arch.startswith("ViT") else clip)["source"]
        name = {"ViTModel": "tester-vit-f32", "ViTForImageClassification": "tester-vit-classifier-f32",
                "CLIPVisionModel": "tester-clip-vision-f32",
                "CLIPVisionModelWithProjection": "tester-clip-vision-proj-f32"}[arch]
        specs.append(vision.VisionSpec(name, f"transformers' {arch} tester config: {side}x{side} images of "
                                       f"2x2 patches ({source})", ["tester", "patches"], arch, config,
                                       seed=11200 + i, image=(side, side)))
    return specs


SPECS: list[Any] = _specs() + _encoder_specs() + _vision_specs()
