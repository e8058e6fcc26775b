"""Tiny random GPT-2 causal-LM cases (GPT2LMHeadModel).

GPT-2 differs from the Llama family in every block: learned absolute position embeddings
(`transformer.wpe`) instead of rope, LayerNorm with bias, fused q/k/v in a Conv1D
(`attn.c_attn`, weights stored [in, out], the transpose of nn.Linear), a biased gelu MLP and
a head always tied to `transformer.wte`. The specs below cover the attention knobs GPT-2
configs carry (`scale_attn_weights`, `scale_attn_by_inverse_layer_idx`,
`reorder_and_upcast_attn`), the activation, `n_inner`, layer_norm_epsilon, left padding and
bf16.

Building, the greedy seed search (margins), left padding and the case layout are lm.py's;
only the base config, the recorded modules and the meaning of position_ids differ.
"""

from __future__ import annotations

from typing import Any

import torch

from lm import BOS_ID, EOS_ID, PAD_ID, VOCAB, LmFamily, LmSpec, build_case  # noqa: F401 (build_case re-exported)

# GPT2Config's own names (n_embd, n_layer, ...); everything not listed keeps GPT-2's default:
# gelu_new, n_inner = 4 * n_embd, layer_norm_epsilon 1e-5, scaled attention, tied head.
BASE_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 64,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
}


def gpt2_points(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """`transformer.wte`, `transformer.wpe`, `transformer.h.N`, `transformer.ln_f` (final norm last).

    The input of `transformer.h.0` is wte + wpe (the dropout between them is the identity in
    eval), so a port that bisects can check both embeddings and their sum from these two.
    """
    t = model.transformer
    points = {"transformer.wte": t.wte, "transformer.wpe": t.wpe}
    for i, block in enumerate(t.h):
        points[f"transformer.h.{i}"] = block
    points["transformer.ln_f"] = t.ln_f
    return points


GPT2_FAMILY = LmFamily(
    BASE_CONFIG,
    gpt2_points,
    "learned absolute positions (rows of transformer.wpe) used for logits/activations: cumsum(mask)-1, "
    "0 on padding, as generate derives them",
)


# With lm.py's std 0.1 GPT-2's greedy decoding settles on repeating one token within a step or
# two; 0.3 gives varied greedy paths (7-15 distinct tokens in 20), so generated_ids exercises the
# cached decode. bf16 keeps 0.1: at 0.3 the logits reach ~7, where one bf16 ulp is 0.03, and even
# torch's own sdpa kernel (or the same weights run in f32) misses the bf16 tolerance on ~2% of them.
WEIGHT_STD = {"f32": 0.3, "bf16": 0.1}


def _spec(name: str, description: str, features: list[str], config: dict[str, Any] | None = None,
          dtype: str = "f32", **kw: Any) -> LmSpec:
    return LmSpec(name, "GPT2LMHeadModel", description, features, config or {}, dtype=dtype,
                  weight_std=WEIGHT_STD[dtype], family=GPT2_FAMILY, **kw)


SPECS: list[LmSpec] = [
    _spec("gpt2-base-f32", "GPT-2 defaults: gelu_new, n_inner 4*n_embd, scaled attention, tied head",
          ["mha", "tied", "learned-positions", "gelu-tanh", "conv1d"], seed=601),
    _spec("gpt2-scale-inv-layer-f32",
          "scale_attn_by_inverse_layer_idx: layer i's scores are further divided by i+1; 3 layers",
          ["mha", "tied", "learned-positions", "scale-attn-inverse-layer"],
          {"n_layer": 3, "scale_attn_by_inverse_layer_idx": True}, seed=602),
    _spec("gpt2-upcast-reorder-f32",
          "reorder_and_upcast_attn (f32 baddbmm with the scale as alpha), n_inner 48, gelu (erf)",
          ["mha", "tied", "learned-positions", "reorder-upcast-attn", "gelu", "n-inner"],
          {"reorder_and_upcast_attn": True, "n_inner": 48, "activation_function": "gelu"}, seed=603),
    _spec("gpt2-noscale-relu-f32", "scale_attn_weights off (no 1/sqrt(head_dim)), relu MLP, layer_norm_epsilon 1e-6",
          ["mha", "tied", "learned-positions", "no-attn-scale", "relu", "layer-norm-eps"],
          {"scale_attn_weights": False, "activation_function": "relu", "layer_norm_epsilon": 1e-6}, seed=604),
    _spec("gpt2-leftpad-f32", "GPT-2 defaults, left-padded batch: wpe rows follow cumsum(mask)-1",
          ["mha", "tied", "learned-positions", "gelu-tanh", "left-padding"], seed=605, left_pad=3),
    _spec("gpt2-base-bf16", "GPT-2 defaults in bfloat16",
          ["mha", "tied", "learned-positions", "gelu-tanh", "bf16"], dtype="bf16", seed=606),
    _spec("gpt2-upcast-bf16",
          "reorder_and_upcast_attn in bfloat16: q.k and softmax in f32, weights cast back to bf16 before @v",
          ["mha", "tied", "learned-positions", "reorder-upcast-attn", "bf16"],
          {"reorder_and_upcast_attn": True}, dtype="bf16", seed=607),
    LmSpec("gpt2-seqcls-f32", "GPT2ForSequenceClassification",
           "GPT2ForSequenceClassification: score (no bias) at each row's rightmost non-padding token, right-padded",
           ["mha", "head:sequence-classification", "right-padding"], weight_std=WEIGHT_STD["f32"],
           family=GPT2_FAMILY, seed=608, prompt_len=8),
    LmSpec("gpt2-tokcls-f32", "GPT2ForTokenClassification",
           "GPT2ForTokenClassification: its `classifier` (with bias) on every token, right-padded",
           ["mha", "head:token-classification", "right-padding"], weight_std=WEIGHT_STD["f32"],
           family=GPT2_FAMILY, seed=609, prompt_len=8),
]
