"""Tiny random T5 encoder cases: T5EncoderModel (t5 v1.0: relu feed-forward; v1.1 / flan-t5:
gated gelu_new) and UMT5EncoderModel (a relative-position bias in every block), the text
encoders of PixArt, SD3 and Flux.

T5 attends without score scaling; each score adds a learned bias by the bucket of
`key - query` (exact for small distances, logarithmic up to `relative_attention_max_distance`),
so the specs use sequences long enough to reach the logarithmic buckets (a small max
distance), and right-padded batches as the tokenizer pads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

from common import TORCH_DTYPES, Case, TensorSpec, randomize_parameters, run_capturing

BASE_CONFIG: dict[str, Any] = {
    "vocab_size": 96, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2, "num_heads": 4,
    "relative_attention_num_buckets": 16, "relative_attention_max_distance": 20, "pad_token_id": 0,
    "eos_token_id": 1, "decoder_start_token_id": 0,
}


@dataclass
class T5Spec:
    name: str
    description: str
    features: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    architecture: str = "T5EncoderModel"
    dtype: str = "f32"
    seed: int = 0
    seq_len: int = 24
    short: int = 9


SPECS: list[T5Spec] = [
    T5Spec("t5-encoder-f32", "T5EncoderModel, t5 v1.0: relu feed-forward, the first block's relative bias shared, "
           "logarithmic buckets past distance 4, a right-padded row", ["relative-bias", "relu", "padding"], seed=1701),
    T5Spec("t5-encoder-gated-f32", "T5EncoderModel, v1.1 / flan-t5: gated-gelu (gelu_new), d_kv != d_model / heads, "
           "32 buckets, max distance 128", ["relative-bias", "gated-gelu", "padding"],
           {"feed_forward_proj": "gated-gelu", "d_kv": 12, "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128, "tie_word_embeddings": False}, seed=1702),
    T5Spec("t5-encoder-gated-bf16", "T5EncoderModel v1.1 in bfloat16", ["relative-bias", "gated-gelu", "bf16"],
           {"feed_forward_proj": "gated-gelu"}, dtype="bf16", seed=1703),
    T5Spec("umt5-encoder-f32", "UMT5EncoderModel: a relative bias in every block, gated-silu", ["relative-bias:per-layer",
                                                                                             "gated-silu", "padding"],
           {"feed_forward_proj": "gated-silu"}, architecture="UMT5EncoderModel", seed=1711),
]


def build_model(spec: T5Spec) -> torch.nn.Module:
    if spec.architecture == "UMT5EncoderModel":
        config, cls = UMT5Config(**{**BASE_CONFIG, **spec.config}), UMT5EncoderModel
    else:
        config, cls = T5Config(**{**BASE_CONFIG, **spec.config}), T5EncoderModel
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, spec.seed, 0.1)
    with torch.no_grad():  # trained position biases are larger than the other weights' noise
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.mul_(10)
    model = model.to(TORCH_DTYPES[spec.dtype]).eval()
    model.config.dtype = TORCH_DTYPES[spec.dtype]
    return model


def make_inputs(spec: T5Spec) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    vocab = {**BASE_CONFIG, **spec.config}["vocab_size"]
    ids = torch.randint(2, vocab, (2, spec.seq_len), generator=gen, dtype=torch.int64)
    ids[0, -1] = 1
    ids[1, spec.short - 1] = 1
    ids[1, spec.short:] = 0
    mask = torch.ones_like(ids)
    mask[1, spec.short:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def build_case(spec: T5Spec, out_dir: Path) -> Case:
    model = build_model(spec)
    model.save_pretrained(out_dir)
    inputs = make_inputs(spec)
    points = {"encoder.embed_tokens": model.encoder.embed_tokens}
    for i, block in enumerate(model.encoder.block):
        points[f"encoder.block.{i}"] = block
    out, captured = run_capturing(points, lambda: model(**inputs))
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    outputs = [TensorSpec("last_hidden_state", out.last_hidden_state.float(),
                          f"encoder.final_layer_norm output [batch, seq, d_model]{stored_as}", compare="allclose",
                          mask="attention_mask")]
    for name, value in captured.items():
        outputs.append(TensorSpec(name, value.float(), f"output of module {name[:-7]}{stored_as}", compare="allclose",
                                  mask="attention_mask"))
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type="umt5" if spec.architecture.startswith("UMT5") else "t5",
        task="feature-extraction",
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=[
            TensorSpec("input_ids", inputs["input_ids"], "token ids [batch, seq]: the second row ends with eos "
                       "(1) then padding (0)"),
            TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding"),
        ],
        outputs=outputs,
    )
