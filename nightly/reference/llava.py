"""Tiny random LLaVA cases (LlavaForConditionalGeneration): a CLIP vision tower, the
multimodal projector and a decoder language model, run by transformers on prompts whose
image tokens (already expanded, as LlavaProcessor writes them) take the images' features.

Cases cover both weight layouts (the Hub's original `language_model.model.*` and
transformers 5's `model.language_model.*`), the `default` (class token dropped) and `full`
feature strategies, one feature layer and several concatenated, Llama and Qwen2 language
models, left padding, and greedy generation from the image prompts.
"""

from __future__ import annotations

import json

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import LlavaConfig, LlavaForConditionalGeneration

from common import TORCH_DTYPES, Case, TensorSpec, randomize_parameters

VISION = {
    "model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "image_size": 32, "patch_size": 8, "projection_dim": 24,
}
SIGLIP_VISION = {
    "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "image_size": 32, "patch_size": 8, "vision_use_head": False,
}
VOCAB, IMAGE_TOKEN, PAD, EOS = 128, 127, 0, 1
TEXT = {
    "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": 2,
}
NEW_TOKENS = 5
# llava-f32 ships a whole model folder, as a Hub repo holds one: a word-level tokenizer whose
# vocabulary fills the model's (<image> last), a LLaVA-1.5-style chat template and a CLIP
# image processor; pipeline.json holds what transformers' processor and generate make of
# one committed image and question, so zoo's image path is checked from the file on.
WORDS = ["user", "assistant", ":", "what", "is", "in", "this", "image", "?", "a", "the", "of", "and", "shown",
         "picture", "describe", "it", "colour", "red", "green", "blue", ".", ","]
CHAT_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'user' %}USER: "
                 "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
                 "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
                 "{% endfor %} {% else %}ASSISTANT: {{ message['content'][0]['text'] }}</s>{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
PIPELINE_IMAGE = "transformers/tests/data/image_processors/rgb.png"
PIPELINE_QUESTION = "What is shown in this picture?"


@dataclass
class LlavaSpec:
    name: str
    description: str
    features: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    text: dict[str, Any] = field(default_factory=dict)
    dtype: str = "f32"
    seed: int = 0
    original_format: bool = True
    vision: dict[str, Any] = field(default_factory=lambda: dict(VISION))


SPECS: list[LlavaSpec] = [
    LlavaSpec("llava-f32", "LlavaForConditionalGeneration: CLIP tower, feature layer -2 without the class token, "
              "gelu projector, Llama; two left-padded prompts with one image each; saved with the Hub's names",
              ["image-tokens", "feature-layer:-2", "strategy:default", "padding", "generation"], seed=1701),
    LlavaSpec("llava-qwen2-full-f32", "LLaVA over Qwen2 with the class token kept (full), layers [-3, -1] "
              "concatenated, a bias-free projector, two images in one prompt; transformers 5's names",
              ["image-tokens", "feature-layers", "strategy:full", "multi-image", "qwen2", "v5-names", "generation"],
              {"vision_feature_select_strategy": "full", "vision_feature_layer": [-3, -1],
               "multimodal_projector_bias": False, "projector_hidden_act": "gelu"},
              {"model_type": "qwen2"}, seed=1702, original_format=False),
    LlavaSpec("llava-siglip-gemma2-f32", "LLaVA over a SigLIP tower without its pooling head (the default strategy "
              "drops its first patch, as transformers does) and Gemma 2 (scaled embeddings, soft-capping, tied head), "
              "feature layer -1", ["image-tokens", "siglip-tower", "gemma2", "generation"],
              {"vision_feature_layer": -1},
              {"model_type": "gemma2", "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8},
              seed=1703, vision=dict(SIGLIP_VISION)),
]


def tokens_per_image(spec: LlavaSpec) -> int:
    side = spec.vision["image_size"] // spec.vision["patch_size"]
    tokens = side * side + int(spec.vision["model_type"] == "clip_vision_model")
    full = spec.config.get("vision_feature_select_strategy") == "full"
    return tokens - int(not full)


def build_model(spec: LlavaSpec) -> LlavaForConditionalGeneration:
    text = {"model_type": "llama", **TEXT, **spec.text}
    config = LlavaConfig(vision_config=dict(spec.vision), text_config=text, image_token_index=IMAGE_TOKEN,
                         **spec.config)
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(spec.seed)
    model = LlavaForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, spec.seed, 0.1)
    model = model.to(TORCH_DTYPES[spec.dtype]).eval()
    model.config.dtype = TORCH_DTYPES[spec.dtype]
    return model


def make_inputs(spec: LlavaSpec) -> dict[str, torch.Tensor]:
    """Two prompts (text, expanded image tokens, text), the shorter left-padded, and their
    images in order."""
    gen = torch.Generator().manual_seed(spec.seed + 7919)
    k = tokens_per_image(spec)
    images = 2 if "multi-image" in spec.features else 1
    rows = []
    for length in (6, 3):
        words = lambda n: torch.randint(3, IMAGE_TOKEN, (n,), generator=gen).tolist()
        row = [2] + words(2)
        if images == 2:
            row += [IMAGE_TOKEN] * k + words(1) + [IMAGE_TOKEN] * k
        else:
            row += [IMAGE_TOKEN] * k
        rows.append(row + words(length))
    width = max(len(r) for r in rows)
    ids = torch.full((2, width), PAD, dtype=torch.int64)
    mask = torch.zeros((2, width), dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0) * mask
    pixel_values = torch.randn(2 * images, 3, spec.vision["image_size"], spec.vision["image_size"], generator=gen)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "pixel_values": pixel_values}


def write_tokenizer(out_dir) -> None:
    """tokenizer.json (lower-cased words, <s> in front) and tokenizer_config.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {"<pad>": PAD, "</s>": EOS, "<s>": 2, "<unk>": 3}
    for i, w in enumerate(WORDS):
        vocab[w] = 4 + i
    for i in range(4 + len(WORDS), IMAGE_TOKEN):
        vocab[f"w{i}"] = i
    vocab["<image>"] = IMAGE_TOKEN
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tok.add_special_tokens(["<pad>", "</s>", "<s>", "<unk>", "<image>"])
    tok.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE,
              "model_max_length": TEXT["max_position_embeddings"]}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def write_pipeline(model: LlavaForConditionalGeneration, out_dir) -> None:
    """The processor files, and pipeline.json: transformers' processor and greedy generate on
    one committed image and question."""
    from PIL import Image
    from transformers import AutoProcessor

    side = VISION["image_size"]
    pre = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": side},
           "crop_size": {"height": side, "width": side}}
    (out_dir / "preprocessor_config.json").write_text(json.dumps(pre, indent=1) + "\n")
    proc = {"processor_class": "LlavaProcessor", "patch_size": VISION["patch_size"],
            "vision_feature_select_strategy": "default", "image_token": "<image>",
            "num_additional_image_tokens": 1, "chat_template": CHAT_TEMPLATE}
    (out_dir / "processor_config.json").write_text(json.dumps(proc, indent=1) + "\n")
    write_tokenizer(out_dir)
    processor = AutoProcessor.from_pretrained(out_dir, backend="pil")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PIPELINE_QUESTION}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.open(Path(__file__).resolve().parents[2] / PIPELINE_IMAGE)
    inputs = processor(images=image, text=prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1]:].tolist()
    doc = {"task": "image-text-to-text", "image": PIPELINE_IMAGE, "question": PIPELINE_QUESTION,
           "prompt": prompt, "input_ids": inputs["input_ids"][0].tolist(), "max_new_tokens": NEW_TOKENS,
           "generated_ids": new, "text": processor.decode(new, skip_special_tokens=True)}
    (out_dir / "pipeline.json").write_text(json.dumps(doc, indent=1) + "\n")


def build_case(spec: LlavaSpec, out_dir) -> Case:
    model = build_model(spec)
    model.save_pretrained(out_dir, save_original_format=spec.original_format)
    if spec.name == "llava-f32":
        write_pipeline(model, Path(out_dir))
    inputs = make_inputs(spec)
    dtype = TORCH_DTYPES[spec.dtype]
    px = inputs["pixel_values"].to(dtype)
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=px,
                                                  vision_feature_layer=model.config.vision_feature_layer,
                                                  vision_feature_select_strategy=model.config.vision_feature_select_strategy)
        features = torch.stack(list(features.pooler_output if hasattr(features, "pooler_output") else features))
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                    position_ids=inputs["position_ids"], pixel_values=px)
        generated = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                   pixel_values=px, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                   do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
    new_ids = generated[:, inputs["input_ids"].shape[1]:]
    stored_as = "" if spec.dtype == "f32" else f", computed in {spec.dtype} and stored as f32 (exact upcast)"
    outputs = [
        TensorSpec("logits", out.logits.float(), f"next-token logits for every input position{stored_as}",
                   compare="allclose", mask="attention_mask"),
        TensorSpec("image_features", features.float(), "the projector's output per image [images, "
                   f"tokens_per_image, text hidden] (get_image_features){stored_as}", compare="allclose"),
        TensorSpec("generated_ids", new_ids, f"{NEW_TOKENS} greedy new tokens per prompt (prompt excluded)",
                   compare="exact"),
    ]
    return Case(
        name=spec.name,
        architecture="LlavaForConditionalGeneration",
        model_type="llava",
        task="image-text-to-text",
        dtype=spec.dtype,
        seed=spec.seed,
        description=spec.description,
        features=spec.features,
        inputs=[
            TensorSpec("input_ids", inputs["input_ids"], f"token ids [batch, seq]; each image as "
                       f"{tokens_per_image(spec)} image tokens ({IMAGE_TOKEN}); left padding uses {PAD}"),
            TensorSpec("attention_mask", inputs["attention_mask"], "1 for a real token, 0 for padding"),
            TensorSpec("position_ids", inputs["position_ids"], "cumsum(attention_mask) - 1, 0 on padding"),
            TensorSpec("pixel_values", inputs["pixel_values"], "normalized pixel values [images, 3, height, "
                       "width], in the order the prompts' image tokens take them"),
        ],
        outputs=outputs,
        generation={
            "do_sample": False,
            "max_new_tokens": NEW_TOKENS,
            "min_new_tokens": NEW_TOKENS,
            "pad_token_id": PAD,
            "eos_token_id": EOS,
        },
    )
