"""Tiny random vision cases: ViT (ViTModel, ViTForImageClassification), CLIP's vision tower
(CLIPVisionModel, CLIPVisionModelWithProjection) and CLIPModel (both towers, logits_per_image).

Pixel values are seeded normal noise, as an image processor's normalized output would be
(the processors themselves are checked against transformers in
transformers/tests/image_processors.rs). Cases cover the patch grid (square and rectangular
patches and images), position embeddings interpolated to other image sizes
(`interpolate_pos_encoding`, case.json's field of that name), ViT's pooler and classifier,
`qkv_bias`, both ViT weight layouts (the original `encoder.layer.N.attention.attention.query`
and transformers 5's `layers.N.attention.q_proj`), CLIP's class embedding, `pre_layrnorm`,
pooled `post_layernorm`, projections, and CLIPModel's normalized embeddings scaled by
`exp(logit_scale)` over a padded text batch.
"""

from __future__ import annotations

import json
import shutil

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig, CLIPVisionModel,
                          CLIPVisionModelWithProjection, ViTConfig, ViTForImageClassification, ViTModel)

from common import TORCH_DTYPES, Case, TensorSpec, randomize_parameters, run_capturing

VIT_CONFIG: dict[str, Any] = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
    "image_size": 32, "patch_size": 8, "num_channels": 3,
}
CLIP_VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "image_size": 32, "patch_size": 8, "projection_dim": 24,
}
# The CLIPModel cases ship the small CLIP tokenizer of hub/tests/data/clip_tokenizer (540
# ids, <|startoftext|> 538, <|endoftext|> 539) and an image processor, so the folder is a
# whole model as a Hub repo holds one (zoo classify / zoo embed run on it).
TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "hub" / "tests" / "data" / "clip_tokenizer"
VOCAB, BOS, EOT = 540, 538, 539
CLIP_TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 16, "projection_dim": 24,
    "bos_token_id": BOS, "eos_token_id": EOT, "pad_token_id": EOT,
}
PROCESSORS = {
    "CLIPModel": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32},
                  "crop_size": {"height": 32, "width": 32}},
    "ViTForImageClassification": {"image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32}},
}
LABELS = ["tabby cat", "golden retriever", "goldfish", "great white shark", "tree frog"]

CLASSES = {
    "ViTModel": (ViTModel, "vit", "image-feature-extraction"),
    "ViTForImageClassification": (ViTForImageClassification, "vit", "image-classification"),
    "CLIPVisionModel": (CLIPVisionModel, "clip_vision_model", "image-feature-extraction"),
    "CLIPVisionModelWithProjection": (CLIPVisionModelWithProjection, "clip_vision_model", "image-feature-extraction"),
    "CLIPModel": (CLIPModel, "clip", "zero-shot-image-classification"),
}


@dataclass
class VisionSpec:
    name: str
    description: str
    features: list[str]
    architecture: str
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "f32"
    seed: int = 0
    image: tuple[int, int] = (32, 32)  # (height, width) of the pixel values
    batch: int = 2
    interpolate: bool = False
    original_format: bool = True  # save with the original (transformers 4) weight names
    # CLIPModel only: the text tower's config over CLIP_TEXT_CONFIG, CLIPConfig's
    # projection_dim, and whether the texts carry this project's tokenizer's bos/end-of-text
    # ids and the folder its tokenizer and processor (False: random ids over the vocabulary,
    # as transformers' CLIP tester builds them, and no pipeline files).
    text_config: dict[str, Any] = field(default_factory=dict)
    projection_dim: int = 24
    special_ids: bool = True


SPECS: list[VisionSpec] = [
    VisionSpec("vit-f32", "ViTModel: 4x4 grid of 8x8 patches, class token, pooler (tanh)",
               ["patches", "cls-token", "pooler"], "ViTModel", seed=1601),
    VisionSpec("vit-classifier-f32", "ViTForImageClassification: 5 labels from id2label, no qkv bias, "
               "layer_norm_eps 1e-6, 3 layers", ["patches", "classifier", "qkv-bias:off"], "ViTForImageClassification",
               {"qkv_bias": False, "layer_norm_eps": 1e-6, "num_hidden_layers": 3,
                "id2label": dict(enumerate(LABELS)), "label2id": {l: i for i, l in enumerate(LABELS)}}, seed=1602),
    VisionSpec("vit-interpolate-f32", "ViTModel on 48x40 images: position embeddings interpolated bicubically from "
               "the 4x4 grid to 6x5 (interpolate_pos_encoding)", ["patches", "interpolate-pos-encoding", "pooler"],
               "ViTModel", image=(48, 40), interpolate=True, seed=1603),
    VisionSpec("vit-rect-f32", "ViTModel with rectangular images and patches (image_size [32, 24], patch_size "
               "[8, 4]); 2 trailing columns the convolution drops", ["patches:rectangular", "pooler"], "ViTModel",
               {"image_size": [32, 24], "patch_size": [8, 4]}, image=(32, 24), seed=1604),
    VisionSpec("vit-v5-names-f32", "ViTForImageClassification saved with transformers 5's weight names "
               "(layers.N.attention.q_proj, mlp.fc1)", ["patches", "classifier", "v5-names"],
               "ViTForImageClassification", {"id2label": {0: "no", 1: "yes"}, "label2id": {"no": 0, "yes": 1}},
               seed=1605, original_format=False),
    VisionSpec("vit-classifier-bf16", "ViTForImageClassification in bfloat16", ["patches", "classifier", "bf16"],
               "ViTForImageClassification", {"id2label": dict(enumerate(LABELS)),
                                             "label2id": {l: i for i, l in enumerate(LABELS)}},
               dtype="bf16", seed=1606),
    VisionSpec("clip-vision-f32", "CLIPVisionModel: quick_gelu, class embedding, pre_layrnorm, pooled "
               "post_layernorm", ["patches", "quick-gelu", "pooled:cls"], "CLIPVisionModel", seed=1611),
    VisionSpec("clip-vision-proj-f32", "CLIPVisionModelWithProjection: gelu, 3 layers, 40x40 images with "
               "interpolated positions, image_embeds", ["patches", "gelu", "projection", "interpolate-pos-encoding"],
               "CLIPVisionModelWithProjection", {"hidden_act": "gelu", "num_hidden_layers": 3}, image=(40, 40),
               interpolate=True, seed=1612),
    VisionSpec("clip-vision-proj-bf16", "CLIPVisionModelWithProjection in bfloat16",
               ["patches", "quick-gelu", "projection", "bf16"], "CLIPVisionModelWithProjection", dtype="bf16",
               seed=1613),
    VisionSpec("clip-model-f32", "CLIPModel: 3 padded texts against 2 images, normalized embeddings, "
               "logits_per_image scaled by exp(logit_scale)", ["contrastive", "padding", "logit-scale"], "CLIPModel",
               seed=1621),
    VisionSpec("clip-model-bf16", "CLIPModel in bfloat16", ["contrastive", "padding", "logit-scale", "bf16"],
               "CLIPModel", dtype="bf16", seed=1622),
]


def build_model(spec: VisionSpec) -> torch.nn.Module:
    cls, _, _ = CLASSES[spec.architecture]
    if spec.architecture == "CLIPModel":
        config = CLIPConfig(text_config=CLIPTextConfig(**{**CLIP_TEXT_CONFIG, **spec.text_config}).to_dict(),
                            vision_config=CLIPVisionConfig(**{**CLIP_VISION_CONFIG, **spec.config}).to_dict(),
                            projection_dim=spec.projection_dim)
    elif spec.architecture.startswith("CLIP"):
        config = CLIPVisionConfig(**{**CLIP_VISION_CONFIG, **spec.config})
    else:
        config = ViTConfig(**{**VIT_CONFIG, **spec.config})
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, spec.seed, 0.1)
    if spec.architecture == "CLIPModel":
        with torch.no_grad():  # a trained temperature (~ln 100), not noise
            model.logit_scale.fill_(4.6)
    model = model.to(TORCH_DTYPES[spec.dtype]).eval()
    model.config.dtype = TORCH_DTYPES[spec.dtype]
    return model


def make_inputs(spec: VisionSpec) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    h, w = spec.image
    inputs = {"pixel_values": torch.randn(spec.batch, 3, h, w, generator=gen)}
    if spec.architecture == "CLIPModel" and not spec.special_ids:
        vocab = {**CLIP_TEXT_CONFIG, **spec.text_config}["vocab_size"]
        ids = torch.randint(0, vocab, (3, 7), generator=gen, dtype=torch.int64)
        mask = torch.ones_like(ids)
        for row, length in enumerate((7, 5, 3)):
            mask[row, length:] = 0
        inputs = {"input_ids": ids, "attention_mask": mask, **inputs}
    elif spec.architecture == "CLIPModel":
        # Three prompts as CLIPTokenizer pads them: bos, words, end-of-text, then end-of-text.
        ids = torch.randint(3, BOS, (3, 9), generator=gen, dtype=torch.int64)
        ids[:, 0] = BOS
        mask = torch.ones_like(ids)
        for row, length in enumerate((9, 6, 4)):
            ids[row, length - 1:] = EOT
            mask[row, length:] = 0
        inputs = {"input_ids": ids, "attention_mask": mask, **inputs}
    return inputs


def tower_points(model: torch.nn.Module, prefix: str) -> dict[str, torch.nn.Module]:
    """The modules whose outputs a case lists, by checkpoint path."""
    if isinstance(model, (ViTModel,)):
        layers = model.layers if hasattr(model, "layers") else model.encoder.layer
        points = {f"{prefix}embeddings": model.embeddings}
        for i, layer in enumerate(layers):
            points[f"{prefix}encoder.layer.{i}"] = layer
        return points
    points = {f"{prefix}pre_layrnorm": model.pre_layrnorm}
    for i, layer in enumerate(model.encoder.layers):
        points[f"{prefix}encoder.layers.{i}"] = layer
    return points


def run_forward(spec: VisionSpec, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    kwargs = {"interpolate_pos_encoding": True} if spec.interpolate else {}
    if isinstance(model, ViTForImageClassification):
        points = tower_points(model.vit, "vit.")
    elif isinstance(model, ViTModel):
        points = tower_points(model, "")
    elif isinstance(model, CLIPVisionModelWithProjection):
        points = tower_points(model.vision_model, "vision_model.")
    elif isinstance(model, CLIPVisionModel):
        points = tower_points(model, "")
    else:
        points = tower_points(model.vision_model, "vision_model.")
    if not spec.original_format:
        points = {k.replace("encoder.layer.", "layers."): v for k, v in points.items()}
    out, captured = run_capturing(points, lambda: model(**inputs, **kwargs))
    if isinstance(model, CLIPModel):
        return {
            "logits_per_image": out.logits_per_image, "logits_per_text": out.logits_per_text,
            "text_embeds": out.text_embeds, "image_embeds": out.image_embeds,
            "text_model_output.last_hidden_state": out.text_model_output.last_hidden_state,
            "vision_model_output.last_hidden_state": out.vision_model_output.last_hidden_state,
            "vision_model_output.pooler_output": out.vision_model_output.pooler_output, **captured,
        }
    result = {"last_hidden_state": out.last_hidden_state if hasattr(out, "last_hidden_state") else None, **captured}
    if isinstance(model, ViTForImageClassification):
        result.pop("last_hidden_state")
        result["logits"] = out.logits
    if getattr(out, "pooler_output", None) is not None:
        result["pooler_output"] = out.pooler_output
    if getattr(out, "image_embeds", None) is not None:
        result["image_embeds"] = out.image_embeds
    return result


MEANINGS = {
    "last_hidden_state": "the final hidden states [batch, tokens, hidden] (class token first)",
    "pooler_output": "the pooled output [batch, hidden] (ViT: tanh(dense(class token)); CLIP: post_layernorm of it)",
    "image_embeds": "visual_projection of the pooled output [batch, projection_dim]",
    "logits": "classifier over the final class token [batch, num_labels]",
    "logits_per_image": "exp(logit_scale) * cosine similarity [images, texts]",
    "logits_per_text": "the transpose [texts, images]",
    "text_embeds": "L2-normalized text_projection of the pooled text state [texts, projection_dim]",
    "text_model_output.last_hidden_state": "the text tower's final-normed states [texts, seq, hidden]",
    "vision_model_output.last_hidden_state": "the vision tower's final states [images, tokens, hidden]",
    "vision_model_output.pooler_output": "the vision tower's pooled state [images, hidden]",
}


PIPELINE_IMAGE = "transformers/tests/data/image_processors/rgb.png"
PIPELINE_LABELS = ["a cat", "a dog", "a red car"]


def write_pipeline_reference(spec: VisionSpec, out_dir: Path) -> None:
    """pipeline.json: what transformers' pipeline answers for one committed image, so
    `zoo classify` is checked end to end (file -> pixels -> model -> probabilities)."""
    from transformers import AutoImageProcessor, pipeline

    image = Path(__file__).resolve().parents[2] / PIPELINE_IMAGE
    processor = AutoImageProcessor.from_pretrained(out_dir, backend="pil")
    if spec.architecture == "CLIPModel":
        pipe = pipeline("zero-shot-image-classification", model=str(out_dir), image_processor=processor)
        result = pipe(str(image), candidate_labels=PIPELINE_LABELS)
        doc = {"task": "zero-shot-image-classification", "labels": PIPELINE_LABELS,
               "hypothesis_template": "This is a photo of {}."}
    else:
        pipe = pipeline("image-classification", model=str(out_dir), image_processor=processor)
        result = pipe(str(image), top_k=5)
        doc = {"task": "image-classification", "top_k": 5}
    doc.update({"image": PIPELINE_IMAGE, "result": [{"label": r["label"], "score": r["score"]} for r in result]})
    (out_dir / "pipeline.json").write_text(json.dumps(doc, indent=1) + "\n")


def build_case(spec: VisionSpec, out_dir: Path) -> Case:
    model = build_model(spec)
    model.save_pretrained(out_dir, save_original_format=spec.original_format)
    if spec.architecture in PROCESSORS and spec.dtype == "f32" and spec.special_ids:
        processor = PROCESSORS[spec.architecture]
        side = spec.config.get("image_size", 32)
        if side != 32 and spec.architecture == "ViTForImageClassification":
            processor = {**processor, "size": {"height": side, "width": side}}
        (out_dir / "preprocessor_config.json").write_text(json.dumps(processor, indent=1) + "\n")
        if spec.architecture == "CLIPModel":
            for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
                shutil.copy(TOKENIZER_DIR / name, out_dir / name)
        write_pipeline_reference(spec, out_dir)
    inputs = make_inputs(spec)
    forward = run_forward(spec, model, inputs)
    _, model_type, task = CLASSES[spec.architecture]
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    outputs = []
    for name, value in forward.items():
        mask = "attention_mask" if name == "text_model_output.last_hidden_state" else None
        meaning = MEANINGS.get(name) or f"output of module {name[:-7]}"
        tolerance = None
        if spec.dtype != "f32" and name.startswith("logits_per_"):
            # A logit is exp(logit_scale) ~ 100 times a cosine whose 16-bit embeddings round at
            # 2^-8: its error scales with the temperature, not with its own size.
            tolerance = {"atol": 1.0, "rtol": 2e-2}
        outputs.append(TensorSpec(name, value.float(), meaning + stored_as, compare="allclose", mask=mask,
                                  tolerance=tolerance))
    tensors = [TensorSpec("pixel_values", inputs["pixel_values"], "normalized pixel values [batch, 3, height, width]")]
    if "input_ids" in inputs:
        tensors = [
            TensorSpec("input_ids", inputs["input_ids"], "token ids [texts, seq]: bos, words, end-of-text, then "
                       "end-of-text padding"),
            TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding"),
        ] + tensors
    extra = {"interpolate_pos_encoding": True} if spec.interpolate else {}
    return Case(
        name=spec.name,
        architecture=spec.architecture,
        model_type=model_type,
        task=task,
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=tensors,
        outputs=outputs,
        extra=extra,
    )
