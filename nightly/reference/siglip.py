"""Tiny random SigLIP cases: SiglipVisionModel (no class token, the attention pooling head),
SiglipTextModel (bidirectional with a padding mask, the last position through `head`) and
SiglipModel (`exp(logit_scale)` times the cosine plus `logit_bias`).

siglip-model-f32 ships a whole model folder (a word-level tokenizer with a pad token, a
SiglipImageProcessor) and pipeline.json: what transformers' zero-shot pipeline answers for
one committed image (prompts padded to 64 tokens, a sigmoid per label), so `zoo classify`
is checked from the file on.
"""

from __future__ import annotations

import json

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import SiglipConfig, SiglipModel, SiglipTextModel, SiglipVisionModel

from common import TORCH_DTYPES, Case, TensorSpec, randomize_parameters

VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "image_size": 32, "patch_size": 8}
VOCAB, PAD = 96, 1
TEXT = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "pad_token_id": PAD}
WORDS = ["this", "is", "a", "photo", "of", "cat", "dog", "red", "car", "."]
PIPELINE_IMAGE = "transformers/tests/data/image_processors/rgb.png"
PIPELINE_LABELS = ["a cat", "a dog", "a red car"]

CLASSES = {
    "SiglipVisionModel": (SiglipVisionModel, "siglip_vision_model", "image-feature-extraction"),
    "SiglipTextModel": (SiglipTextModel, "siglip_text_model", "feature-extraction"),
    "SiglipModel": (SiglipModel, "siglip", "zero-shot-image-classification"),
}


@dataclass
class SiglipSpec:
    name: str
    description: str
    features: list[str]
    architecture: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    image: tuple[int, int] = (32, 32)
    interpolate: bool = False
    original_format: bool = True


SPECS: list[SiglipSpec] = [
    SiglipSpec("siglip-vision-f32", "SiglipVisionModel: biased patch convolution, no class token, post_layernorm "
               "over every token, the attention pooling head", ["patches", "pooling-head", "gelu-tanh"],
               "SiglipVisionModel", seed=1801),
    SiglipSpec("siglip-vision-interpolate-f32", "SiglipVisionModel on 48x40 images (positions interpolated "
               "from the 4x4 grid), without the pooling head, transformers 5's names",
               ["patches", "interpolate-pos-encoding", "no-head", "v5-names"], "SiglipVisionModel",
               {"vision_use_head": False}, seed=1802, image=(48, 40), interpolate=True, original_format=False),
    SiglipSpec("siglip-text-f32", "SiglipTextModel: bidirectional attention with a padding mask, the last "
               "position through head (projection_size 24)", ["padding", "last-position", "head"],
               "SiglipTextModel", {"projection_size": 24}, seed=1803),
    SiglipSpec("siglip-model-f32", "SiglipModel: 3 texts padded to 64 against 2 images, sigmoid-loss logits "
               "(scale and bias)", ["contrastive", "logit-bias", "max-length-padding"], "SiglipModel", seed=1804),
]


def build_model(spec: SiglipSpec) -> torch.nn.Module:
    cls, _, _ = CLASSES[spec.architecture]
    if spec.architecture == "SiglipModel":
        config = SiglipConfig(text_config=dict(TEXT), vision_config={**VISION, **spec.config})
    elif spec.architecture == "SiglipVisionModel":
        config = cls.config_class(**{**VISION, **spec.config})
    else:
        config = cls.config_class(**{**TEXT, **spec.config})
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, spec.seed, 0.1)
    if spec.architecture == "SiglipModel":
        with torch.no_grad():  # SigLIP's trained values are near these, not noise
            model.logit_scale.fill_(2.3)
            model.logit_bias.fill_(-3.0)
    return model.eval()


def write_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"<unk>": 0, "<pad>": PAD, "</s>": 2}
    for i, w in enumerate(WORDS):
        vocab[w] = 3 + i
    for i in range(3 + len(WORDS), VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<unk>", "<pad>", "</s>"])
    tok.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "unk_token": "<unk>",
              "eos_token": "</s>", "model_max_length": 64}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def write_pipeline(out_dir: Path) -> None:
    from transformers import AutoImageProcessor, pipeline

    pre = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 32, "width": 32}}
    (out_dir / "preprocessor_config.json").write_text(json.dumps(pre, indent=1) + "\n")
    write_tokenizer(out_dir)
    image = Path(__file__).resolve().parents[2] / PIPELINE_IMAGE
    processor = AutoImageProcessor.from_pretrained(out_dir, backend="pil")
    pipe = pipeline("zero-shot-image-classification", model=str(out_dir), image_processor=processor)
    result = pipe(str(image), candidate_labels=PIPELINE_LABELS)
    doc = {"task": "zero-shot-image-classification", "labels": PIPELINE_LABELS,
           "hypothesis_template": "This is a photo of {}.", "image": PIPELINE_IMAGE,
           "result": [{"label": r["label"], "score": r["score"]} for r in result]}
    (out_dir / "pipeline.json").write_text(json.dumps(doc, indent=1) + "\n")


def make_inputs(spec: SiglipSpec) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    h, w = spec.image
    inputs: dict[str, torch.Tensor] = {}
    if spec.architecture != "SiglipTextModel":
        inputs["pixel_values"] = torch.randn(2, 3, h, w, generator=gen)
    if spec.architecture != "SiglipVisionModel":
        width = 64 if spec.architecture == "SiglipModel" else 9
        ids = torch.full((3, width), PAD, dtype=torch.int64)
        mask = torch.zeros((3, width), dtype=torch.int64)
        for row, length in enumerate((9, 6, 4)):
            ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=gen)
            mask[row, :length] = 1
        inputs = {"input_ids": ids, "attention_mask": mask, **inputs}
    return inputs


def build_case(spec: SiglipSpec, out_dir) -> Case:
    out_dir = Path(out_dir)
    model = build_model(spec)
    model.save_pretrained(out_dir, save_original_format=spec.original_format)
    if spec.architecture == "SiglipModel":
        write_pipeline(out_dir)
    inputs = make_inputs(spec)
    kwargs = {"interpolate_pos_encoding": True} if spec.interpolate else {}
    with torch.no_grad():
        out = model(**inputs, **kwargs)
    outputs = []
    if spec.architecture == "SiglipModel":
        named = {"logits_per_image": out.logits_per_image, "logits_per_text": out.logits_per_text,
                 "text_embeds": out.text_embeds, "image_embeds": out.image_embeds,
                 "vision_model_output.last_hidden_state": out.vision_model_output.last_hidden_state,
                 "vision_model_output.pooler_output": out.vision_model_output.pooler_output}
    else:
        named = {"last_hidden_state": out.last_hidden_state}
        if out.pooler_output is not None:
            named["pooler_output"] = out.pooler_output
    for name, value in named.items():
        mask = "attention_mask" if name == "last_hidden_state" and "input_ids" in inputs else None
        outputs.append(TensorSpec(name, value.float(), f"SigLIP's {name}", compare="allclose", mask=mask))
    tensors = []
    if "input_ids" in inputs:
        tensors += [TensorSpec("input_ids", inputs["input_ids"], f"token ids [texts, seq], right-padded with {PAD}"),
                    TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding")]
    if "pixel_values" in inputs:
        tensors.append(TensorSpec("pixel_values", inputs["pixel_values"], "normalized pixel values [batch, 3, h, w]"))
    _, model_type, task = CLASSES[spec.architecture]
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type=model_type,
        task=task,
        dtype="f32",
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=tensors,
        outputs=outputs,
        extra={"interpolate_pos_encoding": True} if spec.interpolate else {},
    )
