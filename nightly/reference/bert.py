"""Tiny random BertModel cases: hidden states and pooled output of an encoder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import BertConfig, BertModel

from common import TORCH_DTYPES, Case, TensorSpec, randomize_parameters

VOCAB = 128
PAD_ID = 0

BASE_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": PAD_ID,
}


@dataclass
class BertSpec:
    """One encoder case: config overrides and the shape of its batch."""

    name: str
    description: str
    features: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "f32"
    seed: int = 0
    seq_len: int = 12
    right_pad: int = 4  # pad tokens after the second sentence of the batch
    architecture: str = "BertModel"
    weight_std: float = 0.1


SPECS: list[BertSpec] = [
    BertSpec("bert-base-f32", "2 layers, 4 heads, gelu (erf), two segments, right-padded batch",
             ["gelu", "token-type-ids", "padding"], seed=501),
    BertSpec("bert-gelutanh-f32", "gelu_new (tanh approximation), layer_norm_eps 1e-5",
             ["gelu-tanh", "layer-norm-eps"], {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5}, seed=502),
    BertSpec("bert-h64-f32", "hidden 64, 8 heads, 3 layers, right-padded batch",
             ["gelu", "padding"], {"hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 3,
                                   "intermediate_size": 128}, seed=503, seq_len=16, right_pad=6),
    BertSpec("bert-base-bf16", "the bert-base-f32 shape in bfloat16", ["gelu", "padding", "bf16"],
             dtype="bf16", seed=504),
]


def build_model(spec: BertSpec) -> BertModel:
    config = BertConfig(**{**BASE_CONFIG, **spec.config})
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model = BertModel._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, spec.seed, spec.weight_std)
    model = model.to(TORCH_DTYPES[spec.dtype]).eval()
    model.config.dtype = TORCH_DTYPES[spec.dtype]
    return model


def make_inputs(spec: BertSpec) -> dict[str, torch.Tensor]:
    """Two sentences of random ids; the second is right-padded, each has two segments."""
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    ids = torch.randint(1, VOCAB, (2, spec.seq_len), generator=gen, dtype=torch.int64)
    mask = torch.ones_like(ids)
    token_types = torch.zeros_like(ids)
    token_types[:, spec.seq_len // 2:] = 1
    if spec.right_pad:
        ids[1, -spec.right_pad:] = PAD_ID
        mask[1, -spec.right_pad:] = 0
        token_types[1, -spec.right_pad:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}


def run_forward(model: BertModel, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    captured: dict[str, torch.Tensor] = {}
    points = {"embeddings": model.embeddings}
    for i, layer in enumerate(model.encoder.layer):
        points[f"encoder.layer.{i}"] = layer

    def capture(name):
        def hook(_module, _args, output):
            captured[name] = output[0] if isinstance(output, tuple) else output

        return hook

    hooks = [m.register_forward_hook(capture(f"{n}.output")) for n, m in points.items()]
    try:
        with torch.no_grad():
            out = model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output, **captured}


def build_case(spec: BertSpec, out_dir: Path) -> Case:
    model = build_model(spec)
    model.save_pretrained(out_dir)
    inputs = make_inputs(spec)
    forward = run_forward(model, inputs)
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    outputs = [
        TensorSpec("last_hidden_state", forward["last_hidden_state"].float(),
                   f"encoder output [batch, seq, hidden]{stored_as}", compare="allclose", mask="attention_mask"),
        TensorSpec("pooler_output", forward["pooler_output"].float(),
                   f"tanh(dense(first token)) [batch, hidden]{stored_as}", compare="allclose"),
    ]
    for name, value in forward.items():
        if name.endswith(".output"):
            outputs.append(TensorSpec(name, value.float(), f"output of module {name[:-7]}{stored_as}",
                                      compare="allclose", mask="attention_mask"))
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type="bert",
        task="feature-extraction",
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=[
            TensorSpec("input_ids", inputs["input_ids"], "token ids [batch, seq]; right padding uses pad_token_id"),
            TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding"),
            TensorSpec("token_type_ids", inputs["token_type_ids"], "segment ids (0 or 1)"),
        ],
        outputs=outputs,
    )
