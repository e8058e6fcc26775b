"""Tiny random Phi-3 causal-LM cases (Phi3ForCausalLM: Phi-3, Phi-3.5, Phi-4-mini).

Phi-3 stores q/k/v fused in `qkv_proj` and gate/up fused in `gate_up_proj`; its long-context
checkpoints use longrope, whose short factors apply while the sequence fits
`original_max_position_embeddings` and whose long factors apply past it (with an attention
factor from max/original context); Phi-4-mini rotates only part of each head
(`partial_rotary_factor`); Phi-3-mini-4k slides a window over every layer.

Two longrope cases keep prompt and generation on one side of the switch; the third crosses it
during generation, where transformers' Phi-3 drops the cache and recomputes the whole sequence
with the long factors (`prepare_inputs_for_generation`).
Building, the greedy seed search, left padding and the case layout are lm.py's.
"""

from __future__ import annotations

from typing import Any

from lm import BASE_CONFIG, LmFamily, LmSpec, build_case, decoder_points  # noqa: F401 (build_case re-exported)

PHI3_FAMILY = LmFamily(BASE_CONFIG, decoder_points,
                       "rope positions used for logits/activations: cumsum(mask)-1, 0 on padding")


def _spec(*args: Any, **kwargs: Any) -> LmSpec:
    return LmSpec(*args, family=PHI3_FAMILY, **kwargs)


def _longrope(half: int, original: int) -> dict[str, Any]:
    return {"original_max_position_embeddings": original,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                "short_factor": [1.0 + 0.25 * i for i in range(half)],
                                "long_factor": [1.5 + 0.75 * i for i in range(half)]}}


SPECS: list[LmSpec] = [
    _spec("phi3-fused-f32", "Phi3ForCausalLM", "fused qkv_proj and gate_up_proj, GQA, untied, left-padded",
          ["gqa", "fused-qkv", "fused-gate-up", "untied", "left-padding"], seed=801, left_pad=3),
    _spec("phi3-longrope-short-f32", "Phi3ForCausalLM",
          "longrope, original context 64 of 128: prompt and generation use the short factors",
          ["gqa", "fused-qkv", "rope:longrope"], {"max_position_embeddings": 128, **_longrope(4, 64)}, seed=802),
    _spec("phi3-longrope-long-f32", "Phi3ForCausalLM",
          "longrope, original context 8 of 64: a 12-token prompt and its generation use the long factors",
          ["gqa", "fused-qkv", "rope:longrope", "left-padding"], {"max_position_embeddings": 64, **_longrope(4, 8)},
          seed=803, prompt_len=12, left_pad=2),
    _spec("phi3-longrope-cross-f32", "Phi3ForCausalLM",
          "longrope, original context 16 of 64: a 10-token prompt on the short factors, generation crosses to the "
          "long ones at 17 tokens, where transformers recomputes the whole sequence; left-padded",
          ["gqa", "fused-qkv", "rope:longrope", "longrope-switch", "left-padding"],
          {"max_position_embeddings": 64, **_longrope(4, 16)}, seed=806, left_pad=2),
    _spec("phi3-partial-swa-f32", "Phi3ForCausalLM",
          "partial_rotary_factor 0.75 of head_dim 16 (Phi-4-mini's), MQA, sliding window 6 on every layer, tied",
          ["mqa", "fused-qkv", "partial-rotary", "sliding-window", "tied", "head-dim"],
          {"num_key_value_heads": 1, "head_dim": 16, "sliding_window": 6, "tie_word_embeddings": True,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}},
          seed=804),
    _spec("phi3-fused-bf16", "Phi3ForCausalLM", "fused projections in bfloat16, left-padded",
          ["gqa", "fused-qkv", "fused-gate-up", "bf16", "left-padding"], dtype="bf16", seed=805, left_pad=2),
]
