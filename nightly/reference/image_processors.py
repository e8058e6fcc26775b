"""Writes transformers/tests/data/image_processors/: small images in the formats and modes
zoo reads (PNG RGB / RGBA / grayscale / grayscale+alpha / palette with transparency, JPEG
color 4:2:0 and 4:4:4, JPEG grayscale), processor configs (CLIP's and ViT's defaults, and
variants: other filters, upscaling, a crop larger than the image, no rescale; a folder a
CLIPProcessor saved, its image processor nested in processor_config.json), and
expected.safetensors: the pixel values transformers' PIL backend gives each image under
each processor (`AutoImageProcessor.from_pretrained(dir, backend="pil")`, images read with
`transformers.image_utils.load_image`).

The pictures are smooth gradients with noise and sharp edges, so the filters' taps,
rounding and clamping all show. Also writes a 16-bit PNG, which zoo refuses.

Run: .venv/bin/python nightly/reference/image_processors.py
"""

import importlib.metadata
import json
import os

import numpy as np
from PIL import Image
from safetensors.numpy import save_file
from transformers import AutoImageProcessor
from transformers.image_utils import load_image

OUT = os.path.join(os.path.dirname(__file__), "../../transformers/tests/data/image_processors")

PROCESSORS = {
    # CLIP as openai/clip-vit-base-patch32 ships it (size as a dict, bicubic, crop 224).
    "clip-default": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 224},
                     "crop_size": {"height": 224, "width": 224}, "resample": 3, "do_center_crop": True,
                     "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
                     "image_mean": [0.48145466, 0.4578275, 0.40821073],
                     "image_std": [0.26862954, 0.26130258, 0.27577711], "rescale_factor": 0.00392156862745098},
    # The legacy feature-extractor spelling with integer sizes, shrinking.
    "clip-legacy-small": {"feature_extractor_type": "CLIPFeatureExtractor", "size": 20, "crop_size": 16},
    # A crop larger than the resized image (zero padding), lanczos.
    "clip-crop-pads": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 24},
                       "crop_size": {"height": 40, "width": 30}, "resample": 1},
    # ViT's default (bilinear to a square), here 32x32.
    "vit-default": {"image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32},
                    "resample": 2, "do_normalize": True, "do_rescale": True, "do_resize": True,
                    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    # Upscaling with box and hamming; nearest; no rescale (0..255 normalized by its own std).
    "vit-box-up": {"image_processor_type": "ViTImageProcessor", "size": {"height": 70, "width": 90}, "resample": 4},
    "vit-hamming": {"image_processor_type": "ViTImageProcessor", "size": {"height": 21, "width": 17}, "resample": 5},
    "vit-nearest": {"image_processor_type": "ViTImageProcessor", "size": {"height": 19, "width": 45}, "resample": 0},
    "vit-no-rescale": {"image_processor_type": "ViTImageProcessor", "size": 24, "do_rescale": False,
                       "image_mean": [120, 110, 100], "image_std": [60, 50, 40]},
}


# Folders saved by transformers itself: a CLIPProcessor's save_pretrained writes the image
# processor nested in processor_config.json (transformers 5), beside a stale
# preprocessor_config.json of other settings that transformers reads second.
SAVED = {
    "clip-saved-nested": {"size": {"shortest_edge": 26}, "crop_size": {"height": 22, "width": 30}, "resample": 2},
}
STALE = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 64},
         "crop_size": {"height": 64, "width": 64}}
TOKENIZER = os.path.join(os.path.dirname(__file__), "../fixtures/clip-model-f32")


def save_processor(folder: str, settings: dict) -> None:
    from transformers import CLIPImageProcessor, CLIPProcessor, CLIPTokenizer

    processor = CLIPProcessor(image_processor=CLIPImageProcessor(**settings),
                              tokenizer=CLIPTokenizer.from_pretrained(TOKENIZER))
    processor.save_pretrained(folder)
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
        json.dump(STALE, f, indent=1)


def picture(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x / w * 255, y / h * 255, (x + y) / (w + h) * 255], axis=-1)
    base[(x // 7 + y // 5) % 2 == 0] = 255 - base[(x // 7 + y // 5) % 2 == 0]
    noisy = base + rng.normal(0, 18, base.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def write_images() -> list[str]:
    names = []
    rgb = picture(48, 64, 0)
    Image.fromarray(rgb).save(os.path.join(OUT, "rgb.png"))
    tall = picture(61, 37, 1)
    Image.fromarray(tall).save(os.path.join(OUT, "tall.png"))
    alpha = np.concatenate([picture(30, 40, 2), np.tile(np.linspace(0, 255, 40, dtype=np.uint8), (30, 1))[..., None]],
                           axis=-1)
    Image.fromarray(alpha, "RGBA").save(os.path.join(OUT, "rgba.png"))
    gray = picture(33, 50, 3)[..., 0]
    Image.fromarray(gray, "L").save(os.path.join(OUT, "gray.png"))
    la = np.stack([gray, np.tile(np.linspace(255, 0, 50, dtype=np.uint8), (33, 1))], axis=-1)
    Image.fromarray(la, "LA").save(os.path.join(OUT, "gray_alpha.png"))
    pal = Image.fromarray(picture(25, 35, 4)).quantize(colors=16)
    pal.info["transparency"] = 3
    pal.save(os.path.join(OUT, "palette.png"), transparency=3)
    Image.fromarray(rgb).save(os.path.join(OUT, "color420.jpg"), quality=90)
    Image.fromarray(tall).save(os.path.join(OUT, "color444.jpg"), quality=95, subsampling=0)
    Image.fromarray(gray, "L").save(os.path.join(OUT, "gray.jpg"), quality=85)
    names = ["rgb.png", "tall.png", "rgba.png", "gray.png", "gray_alpha.png", "palette.png", "color420.jpg",
             "color444.jpg", "gray.jpg"]
    # 16-bit grayscale: zoo refuses it rather than clip it to 8 bits as PIL's convert does.
    Image.fromarray(picture(8, 8, 5)[..., 0].astype(np.uint16) * 257).save(os.path.join(OUT, "gray16.png"))
    return names


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    images = write_images()
    expected = {}
    for name, config in [*PROCESSORS.items(), *SAVED.items()]:
        folder = os.path.join(OUT, "processors", name)
        os.makedirs(folder, exist_ok=True)
        if name in SAVED:
            save_processor(folder, config)
        else:
            with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
                json.dump(config, f, indent=1)
        processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
        # CLIP's real 224x224 output is 600 KB an image: two images cover it.
        for image in images if name != "clip-default" else ["rgb.png", "color420.jpg"]:
            pixels = processor(load_image(os.path.join(OUT, image)), return_tensors="np")["pixel_values"]
            expected[f"{name}/{image}"] = np.ascontiguousarray(pixels[0].astype(np.float32))
    save_file(expected, os.path.join(OUT, "expected.safetensors"))
    versions = {p: importlib.metadata.version(p) for p in ("transformers", "pillow", "numpy")}
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        json.dump({"images": images, "processors": [*PROCESSORS, *SAVED], **versions}, f, indent=1)
    print(f"wrote {len(expected)} pixel-value arrays to {OUT}")


if __name__ == "__main__":
    main()
