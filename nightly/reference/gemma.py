"""Tiny random Gemma, Gemma 2 and Gemma 3 (text) causal-LM cases.

Gemma departs from Llama in ways a port gets wrong silently: embeddings scaled by
sqrt(hidden) rounded to the model dtype, RMSNorm scaling by 1 + weight in f32, the tanh GELU
(legacy configs say `hidden_act: "gelu"`), a head_dim of its own and tied embeddings. Gemma 2
adds sandwich norms, `query_pre_attn_scalar`, attention and final logit soft-capping and
alternating sliding/global layers; Gemma 3 adds q/k norms, one global layer in
`sliding_window_pattern` and a second rope (`rope_local_base_freq`) for the sliding layers,
the global one scaled. Windows are smaller than prompt + generation so they matter.

Building, the greedy seed search, left padding and the case layout are lm.py's.
"""

from __future__ import annotations

from typing import Any

from lm import BASE_CONFIG, LmFamily, LmSpec, build_case, decoder_points  # noqa: F401 (build_case re-exported)

GEMMA_BASE: dict[str, Any] = {**BASE_CONFIG, "head_dim": 16, "tie_word_embeddings": True}
GEMMA_FAMILY = LmFamily(GEMMA_BASE, decoder_points,
                        "rope positions used for logits/activations: cumsum(mask)-1, 0 on padding")


def _spec(*args: Any, **kwargs: Any) -> LmSpec:
    return LmSpec(*args, family=GEMMA_FAMILY, **kwargs)


def _gemma3_rope(local: float, global_theta: float, **scaling: Any) -> dict[str, Any]:
    return {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
        "full_attention": {"rope_theta": global_theta, **(scaling or {"rope_type": "default"})},
    }}


SPECS: list[LmSpec] = [
    _spec("gemma-mqa-f32", "GemmaForCausalLM",
          "MQA, head_dim 16 != hidden/heads, tied, legacy hidden_act gelu (read as the tanh GELU), left-padded",
          ["mqa", "head-dim", "tied", "gelu-tanh", "scaled-embeddings", "left-padding"],
          {"num_key_value_heads": 1, "hidden_act": "gelu"}, seed=501, left_pad=3),
    _spec("gemma-gqa-bf16", "GemmaForCausalLM",
          "GQA in bfloat16: sqrt(hidden) rounded to bf16, norms in f32",
          ["gqa", "head-dim", "tied", "bf16", "scaled-embeddings"], dtype="bf16", seed=502),
    _spec("gemma2-softcap-swa-f32", "Gemma2ForCausalLM",
          "attention (50) and final (30) soft-capping, sliding window 4 on even layers, query_pre_attn_scalar 24, "
          "sandwich norms, left-padded",
          ["gqa", "softcap", "sliding-window", "sandwich-norms", "query-pre-attn-scalar", "left-padding"],
          {"sliding_window": 4, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 50.0,
           "final_logit_softcapping": 30.0}, seed=601, left_pad=2),
    _spec("gemma2-tightcap-f32", "Gemma2ForCausalLM",
          "caps that bite: attention cap 0.5 and final cap 2, four layers alternating sliding (window 3) and global",
          ["mqa", "softcap", "sliding-window", "sandwich-norms"],
          {"sliding_window": 3, "num_hidden_layers": 4, "num_key_value_heads": 1, "query_pre_attn_scalar": 16,
           "attn_logit_softcapping": 0.5, "final_logit_softcapping": 2.0}, seed=602),
    _spec("gemma2-softcap-bf16", "Gemma2ForCausalLM", "soft-capping and a sliding window in bfloat16",
          ["gqa", "softcap", "sliding-window", "bf16"],
          {"sliding_window": 4, "query_pre_attn_scalar": 16}, dtype="bf16", seed=603),
    _spec("gemma3-pattern-f32", "Gemma3ForCausalLM",
          "six layers, one global in sliding_window_pattern 6, window 4; q/k norms; local rope 1e4, global rope 1e6 "
          "with linear scaling 8; left-padded",
          ["gqa", "qk-norm", "sliding-window", "rope:per-layer-type", "rope:linear", "left-padding"],
          {"num_hidden_layers": 6, "sliding_window": 4, "query_pre_attn_scalar": 16,
           **_gemma3_rope(10_000.0, 1_000_000.0, rope_type="linear", factor=8.0)}, seed=701, left_pad=3),
    _spec("gemma3-layertypes-f32", "Gemma3ForCausalLM",
          "explicit layer_types (sliding, global, sliding), MQA, window 5, caps on, untied head",
          ["mqa", "qk-norm", "sliding-window", "softcap", "untied", "rope:per-layer-type"],
          {"num_hidden_layers": 3, "num_key_value_heads": 1, "sliding_window": 5,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
           "attn_logit_softcapping": 20.0, "final_logit_softcapping": 10.0, "tie_word_embeddings": False,
           **_gemma3_rope(100.0, 5_000.0)}, seed=702),
    _spec("gemma3-qknorm-bf16", "Gemma3ForCausalLM", "q/k norms and two ropes in bfloat16, left-padded",
          ["gqa", "qk-norm", "sliding-window", "bf16", "left-padding"],
          {"num_hidden_layers": 2, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
           **_gemma3_rope(10_000.0, 1_000_000.0)}, dtype="bf16", seed=703, left_pad=2),
    _spec("gemma2-seqcls-f32", "Gemma2ForSequenceClassification",
          "Gemma 2's softcapped, windowed decoder under the generic sequence head, right-padded",
          ["gqa", "softcap", "sliding-window", "head:sequence-classification", "right-padding"],
          {"sliding_window": 4, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
          seed=704, prompt_len=8),
]
