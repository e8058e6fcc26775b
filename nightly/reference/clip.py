"""Tiny random CLIP text-encoder cases: CLIPTextModel and CLIPTextModelWithProjection.

CLIP's text tower is a pre-norm causal encoder (quick_gelu by default) whose pooled output
is the final-normed hidden state at the end-of-text token, found two ways: configs with the
legacy `eos_token_id` 2 take the position of the highest id in each row (the end-of-text
token has the highest id in CLIP's vocabulary; the first one when padding repeats it), newer
configs the first position holding `eos_token_id`. Pipelines pad with the end-of-text token
itself, so the specs do too. The projection head multiplies the pooled output by
`text_projection` (`text_embeds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from common import TORCH_DTYPES, Case, TensorSpec, randomize_parameters, run_capturing

VOCAB = 128
EOT = VOCAB - 1  # end-of-text, the highest id as in CLIP's vocabulary
BOS = VOCAB - 2

BASE_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 16,
    "projection_dim": 24,
    "bos_token_id": BOS,
    "eos_token_id": EOT,
    "pad_token_id": 1,
}

ARCHITECTURES = {"CLIPTextModel": CLIPTextModel, "CLIPTextModelWithProjection": CLIPTextModelWithProjection}


@dataclass
class ClipTextSpec:
    name: str
    description: str
    features: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    architecture: str = "CLIPTextModel"
    dtype: str = "f32"
    seed: int = 0
    seq_len: int = 12
    short: int = 5  # real tokens of the second row (bos, words, eot), then end-of-text padding
    # False: random ids over the config's vocabulary and no bos/end-of-text tokens (a config
    # whose special ids lie outside its vocabulary, as transformers' CLIP tester's do).
    special_ids: bool = True


SPECS: list[ClipTextSpec] = [
    ClipTextSpec("clip-text-f32", "CLIPTextModel: quick_gelu, pooled at the first eos_token_id, a row padded with "
                 "end-of-text tokens", ["quick-gelu", "causal", "padding", "pooled:eos"], seed=1401),
    ClipTextSpec("clip-text-legacy-eos-f32", "eos_token_id 2 (configs before transformers' PR 24773): pooled at the "
                 "highest id, the first of the repeated end-of-text padding", ["quick-gelu", "causal", "padding",
                                                                              "pooled:argmax"],
                 {"eos_token_id": 2}, seed=1402),
    ClipTextSpec("clip-text-proj-f32", "CLIPTextModelWithProjection: gelu, 3 layers, layer_norm_eps 1e-6, "
                 "text_embeds", ["gelu", "causal", "padding", "projection"],
                 {"hidden_act": "gelu", "num_hidden_layers": 3, "layer_norm_eps": 1e-6},
                 architecture="CLIPTextModelWithProjection", seed=1403, seq_len=16, short=7),
    ClipTextSpec("clip-text-proj-bf16", "CLIPTextModelWithProjection in bfloat16", ["quick-gelu", "causal", "padding",
                                                                                   "projection", "bf16"],
                 architecture="CLIPTextModelWithProjection", dtype="bf16", seed=1404),
]


def build_model(spec: ClipTextSpec) -> torch.nn.Module:
    config = CLIPTextConfig(**{**BASE_CONFIG, **spec.config})
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model = ARCHITECTURES[spec.architecture]._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, spec.seed, 0.1)
    model = model.to(TORCH_DTYPES[spec.dtype]).eval()
    model.config.dtype = TORCH_DTYPES[spec.dtype]
    return model


def make_inputs(spec: ClipTextSpec) -> dict[str, torch.Tensor]:
    """Two rows as CLIPTokenizer pads them for a pipeline: bos, words, end-of-text, then
    end-of-text padding with a zero mask."""
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    if not spec.special_ids:
        vocab = {**BASE_CONFIG, **spec.config}["vocab_size"]
        ids = torch.randint(0, vocab, (2, spec.seq_len), generator=gen, dtype=torch.int64)
        mask = torch.ones_like(ids)
        mask[1, spec.short:] = 0
        return {"input_ids": ids, "attention_mask": mask}
    ids = torch.randint(3, BOS, (2, spec.seq_len), generator=gen, dtype=torch.int64)
    ids[:, 0] = BOS
    ids[0, -1] = EOT
    ids[1, spec.short - 1:] = EOT
    mask = torch.ones_like(ids)
    mask[1, spec.short:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def run_forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Module paths as the checkpoint names them: transformers 5 saves a bare CLIPTextModel's
    # transformer at the root, the projection head's under `text_model.`.
    with_head = isinstance(model, CLIPTextModelWithProjection)
    text, prefix = (model.text_model, "text_model.") if with_head else (model, "")
    points = {f"{prefix}embeddings": text.embeddings}
    for i, layer in enumerate(text.encoder.layers):
        points[f"{prefix}encoder.layers.{i}"] = layer
    out, captured = run_capturing(points, lambda: model(**inputs))
    result = {"last_hidden_state": out.last_hidden_state, **captured}
    if isinstance(model, CLIPTextModelWithProjection):
        result["text_embeds"] = out.text_embeds
    else:
        result["pooler_output"] = out.pooler_output
    return result


def build_case(spec: ClipTextSpec, out_dir: Path) -> Case:
    model = build_model(spec)
    model.save_pretrained(out_dir)
    inputs = make_inputs(spec)
    forward = run_forward(model, inputs)
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    rule = "the highest id" if model.config.eos_token_id == 2 else "the first eos_token_id"
    outputs = [TensorSpec("last_hidden_state", forward["last_hidden_state"].float(),
                          f"final_layer_norm output [batch, seq, hidden]{stored_as}", compare="allclose",
                          mask="attention_mask")]
    if "pooler_output" in forward:
        outputs.append(TensorSpec("pooler_output", forward["pooler_output"].float(),
                                  f"last_hidden_state at {rule} of each row [batch, hidden]{stored_as}",
                                  compare="allclose"))
    if "text_embeds" in forward:
        outputs.append(TensorSpec("text_embeds", forward["text_embeds"].float(),
                                  f"text_projection of the state at {rule} [batch, projection_dim]{stored_as}",
                                  compare="allclose"))
    for name, value in forward.items():
        if name.endswith(".output"):
            outputs.append(TensorSpec(name, value.float(), f"output of module {name[:-7]}{stored_as}",
                                      compare="allclose", mask="attention_mask"))
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type="clip_text_model",
        task="feature-extraction",
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=[
            TensorSpec("input_ids", inputs["input_ids"], "token ids [batch, seq]: bos, words, end-of-text, then "
                       "end-of-text padding"),
            TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding"),
        ],
        outputs=outputs,
    )
