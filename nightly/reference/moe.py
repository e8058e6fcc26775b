"""Tiny random mixture-of-experts causal-LM cases: Mixtral, Qwen2-MoE, Qwen3-MoE.

Each MoE layer routes every token to `num_experts_per_tok` of its experts: a linear router,
a softmax in f32, the top k. Mixtral renormalises the k weights and keeps them in f32 for the
weighted sum; Qwen2-MoE and Qwen3-MoE renormalise only with `norm_topk_prob` and round the
weights to the model dtype; Qwen2-MoE adds a shared expert behind a sigmoid gate. Qwen's
`decoder_sparse_step` and `mlp_only_layers` leave some layers dense. The specs cover every
routing variant, top-1 to top-3, a sliding window shorter than the prompt, and both
checkpoint layouts: the original per-expert tensors (`experts.N.w1`, `experts.N.gate_proj`)
and transformers' fused ones (`experts.gate_up_proj [E, 2I, H]`, `experts.down_proj`).

Seeds are searched until no router choice is near a tie (lm.routing_gap), so a port's
rounding cannot flip an expert. Building, the greedy seed search, left padding and the case
layout are lm.py's.
"""

from __future__ import annotations

from typing import Any

import torch

from lm import BASE_CONFIG, LmFamily, LmSpec, build_case, decoder_points  # noqa: F401 (build_case re-exported)


def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    # The base model: `model` in the causal LMs, `transformer` in some question-answering classes.
    base = getattr(model, model.base_model_prefix)
    return [layer.mlp.gate for layer in base.layers if hasattr(layer.mlp, "experts")]


# Trained routers are decisive: their logits spread over several units, not the +-0.5 that
# the 0.1-std random init gives, which would leave many choices within rounding of a tie.
ROUTER_SCALE = 8.0


def _decisive_routers(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for router in _routers(model):
            router.weight.mul_(ROUTER_SCALE)


MOE_BASE: dict[str, Any] = {**BASE_CONFIG, "intermediate_size": 48}
MOE_FAMILY = LmFamily(MOE_BASE, decoder_points,
                      "rope positions used for logits/activations: cumsum(mask)-1, 0 on padding",
                      routers=_routers, adjust=_decisive_routers)


def _spec(*args: Any, **kwargs: Any) -> LmSpec:
    return LmSpec(*args, family=MOE_FAMILY, **kwargs)


def _qwen(experts: int, top_k: int, **extra: Any) -> dict[str, Any]:
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": 24, **extra}


SPECS: list[LmSpec] = [
    _spec("mixtral-top2-f32", "MixtralForCausalLM",
          "4 experts, top-2 renormalised, GQA, untied, left-padded",
          ["gqa", "moe", "moe:top-2", "moe:renormalize", "untied", "left-padding"],
          {"num_local_experts": 4, "num_experts_per_tok": 2}, seed=901, left_pad=3),
    _spec("mixtral-top1-swa-fused-f32", "MixtralForCausalLM",
          "8 experts, top-1, sliding window 6 over a 12-token prompt, tied; saved in the fused experts layout",
          ["gqa", "moe", "moe:top-1", "sliding-window", "tied", "moe:fused-checkpoint"],
          {"num_local_experts": 8, "num_experts_per_tok": 1, "sliding_window": 6, "tie_word_embeddings": True},
          seed=902, prompt_len=12, save_original_format=False),
    _spec("mixtral-top3-bf16", "MixtralForCausalLM",
          "6 experts, top-3 in bfloat16: f32 routing weights, three bf16 additions per token",
          ["gqa", "moe", "moe:top-3", "moe:renormalize", "bf16"],
          {"num_local_experts": 6, "num_experts_per_tok": 3}, dtype="bf16", seed=903, prompt_len=6),
    _spec("qwen2moe-shared-f32", "Qwen2MoeForCausalLM",
          "4 experts, top-2 not renormalised, shared expert with a sigmoid gate, q/k/v biases, left-padded",
          ["gqa", "moe", "moe:top-2", "moe:shared-expert", "qkv-bias", "left-padding"],
          _qwen(4, 2, shared_expert_intermediate_size=40), seed=1001, left_pad=2),
    _spec("qwen2moe-sparse-step-fused-f32", "Qwen2MoeForCausalLM",
          "four layers, decoder_sparse_step 2 and mlp_only_layers [3]: only layer 1 routes (6 experts, top-2 "
          "renormalised); MQA, tied; saved in the fused experts layout",
          ["mqa", "moe", "moe:top-2", "moe:renormalize", "moe:shared-expert", "moe:sparse-step",
           "moe:mlp-only-layers", "tied", "moe:fused-checkpoint"],
          {**_qwen(6, 2, shared_expert_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=2,
                   mlp_only_layers=[3]),
           "num_hidden_layers": 4, "num_key_value_heads": 1, "tie_word_embeddings": True},
          seed=1002, save_original_format=False),
    _spec("qwen2moe-shared-bf16", "Qwen2MoeForCausalLM",
          "4 experts, top-2, shared expert, in bfloat16: weights rounded to bf16 before the weighted sum",
          ["gqa", "moe", "moe:top-2", "moe:shared-expert", "qkv-bias", "bf16"],
          _qwen(4, 2, shared_expert_intermediate_size=40), dtype="bf16", seed=1003),
    _spec("qwen3moe-norm-f32", "Qwen3MoeForCausalLM",
          "8 experts, top-2 renormalised (norm_topk_prob), q/k norms, head_dim 16, left-padded",
          ["gqa", "moe", "moe:top-2", "moe:renormalize", "qk-norm", "head-dim", "left-padding"],
          {**_qwen(8, 2, norm_topk_prob=True), "head_dim": 16}, seed=1101, left_pad=3),
    _spec("qwen3moe-swa-step-f32", "Qwen3MoeForCausalLM",
          "three layers, decoder_sparse_step 1 and mlp_only_layers [0]; 4 experts, top-3 not renormalised; "
          "sliding window 6 over a 12-token prompt; attention_bias",
          ["gqa", "moe", "moe:top-3", "moe:mlp-only-layers", "sliding-window", "qk-norm", "attention-bias"],
          {**_qwen(4, 3, mlp_only_layers=[0]), "num_hidden_layers": 3, "head_dim": 8, "use_sliding_window": True,
           "sliding_window": 6, "attention_bias": True}, seed=1102, prompt_len=12),
    _spec("qwen3moe-fused-bf16", "Qwen3MoeForCausalLM",
          "6 experts, top-2 renormalised, in bfloat16; saved in the fused experts layout",
          ["gqa", "moe", "moe:top-2", "moe:renormalize", "qk-norm", "bf16", "moe:fused-checkpoint"],
          {**_qwen(6, 2, norm_topk_prob=True), "head_dim": 8}, dtype="bf16", seed=1103, prompt_len=6,
          save_original_format=False),
    _spec("qwen2moe-seqcls-f32", "Qwen2MoeForSequenceClassification",
          "Qwen2-MoE (4 experts, top-2, a shared expert) under the generic sequence head, right-padded",
          ["gqa", "moe", "shared-expert", "head:sequence-classification", "right-padding"],
          _qwen(4, 2, shared_expert_intermediate_size=40), seed=1004, prompt_len=8),
]
