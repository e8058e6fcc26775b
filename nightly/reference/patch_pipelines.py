"""Writes the patch-transformer cases of diffusers/tests/data/pipelines/ (DiT and PixArt): one folder
per case with a tiny random pipeline as diffusers' `save_pretrained(..., safe_serialization=True)`
lays it out (float32), plus expected.safetensors and case.json: what diffusers computes with that
folder, reloaded by `from_pretrained(folder, dtype=float32)`. Conventions and helpers are those of
pipelines.py and flow_pipelines.py (their folders are left alone). Also writes
diffusers/src/pipelines/aspect_ratio_bins.json: the PixArt pipelines' resolution-binning tables.

Cases:
  `dit`          DiTPipeline: DiTTransformer2DModel (2 blocks, 2 heads of 8, learned sigma: out_channels
                 8 = 2 x in_channels 4, num_embeds_ada_norm 1000, sample_size 16), 4-channel
                 AutoencoderKL, DDIMScheduler; model_index.json carries `id2label` (a few ImageNet
                 classes, comma-separated synonyms) as the Hub's DiT pipelines do; class labels from
                 two names (batch 2), guidance 4.0;
  `pixart-alpha` PixArtAlphaPipeline: PixArtTransformer2DModel (2 blocks, 3 heads of 8, caption_channels
                 32 = T5's d_model, sample_size 128, so interpolation_scale 2 and the resolution /
                 aspect-ratio conditioning are on), T5EncoderModel, DPMSolverMultistepScheduler; a
                 32x48 image (the sin-cos positions recomputed for the 8x12 patch grid) without
                 resolution binning; CFG 4.5 with a negative prompt;
  `pixart-sigma` PixArtSigmaPipeline: PixArtTransformer2DModel (sample_size 32, no additional
                 conditions), 8x AutoencoderKL (4 blocks); 128x192 asked for with resolution binning:
                 generated at the 256-bin size (208x304) and resized / cropped back.

Every weight is random and then perturbed (pipelines.perturbed). The T5 tokenizer folders hold
transformers/tests/data/t5_tokenizer/; max_sequence_length is 16; prompts are passed with
clean_caption=False (lower-cased and stripped: caption cleaning needs bs4 and ftfy).

expected.safetensors holds, per case (float32):
  transformer.hidden_states, transformer.timestep [2] -> transformer.out: the transformer alone;
  DiT: + transformer.class_labels [2] (one real label, the null label 1000);
  PixArt: + transformer.encoder_hidden_states [2, 16, 32], transformer.encoder_attention_mask [2, 16]
  (1 = token, 0 = padding), and for pixart-alpha transformer.resolution [2, 2] and
  transformer.aspect_ratio [2, 1] (added_cond_kwargs);
  vae.latents -> vae.decoded (plain vae.decode);
  PixArt: prompt_embeds, prompt_attention_mask, negative_prompt_embeds, negative_prompt_attention_mask
  (encode_prompt of the case's prompt and negative prompt);
  pipe.latents -> pipe.image (output_type "np"): DiT draws its latents itself (the recorded draw is
  pipe.latents); PixArt takes them as latents=; timesteps: the timestep of each step.

Run: .venv/bin/python nightly/reference/patch_pipelines.py
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import T5EncoderModel  # noqa: E402

import diffusers  # noqa: E402
import transformers  # noqa: E402
from diffusers import (AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel,  # noqa: E402
                       DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtSigmaPipeline,
                       PixArtTransformer2DModel)
from diffusers.pipelines.pixart_alpha import pipeline_pixart_alpha, pipeline_pixart_sigma  # noqa: E402
from flow_pipelines import VAE, save, t5_config, t5_tokenizer  # noqa: E402
from pipelines import NEGATIVE, PROMPT, NoiseRecorder, build, check_eval_f32  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "diffusers/tests/data/pipelines"
BINS = ROOT / "diffusers/src/pipelines/aspect_ratio_bins.json"
COMMAND = ".venv/bin/python nightly/reference/patch_pipelines.py"

STEPS = 3
MAX_SEQUENCE_LENGTH = 16
TIMESTEPS = [37, 912]
TOLERANCES = {"transformer": 1e-4, "vae": 1e-4, "image": 1e-3}
SD_VAE = {**VAE, "latent_channels": 4, "scaling_factor": 0.18215}
SD_VAE_8X = {**SD_VAE, "block_out_channels": [8, 8, 16, 16], "down_block_types": ["DownEncoderBlock2D"] * 4,
             "up_block_types": ["UpDecoderBlock2D"] * 4}
ID2LABEL = {"0": "tench, Tinca tinca", "1": "goldfish, Carassius auratus", "207": "golden retriever",
            "281": "tabby, tabby cat", "999": "toilet tissue, toilet paper, bathroom tissue"}
DIT_LABELS = ["golden retriever", "goldfish"]


def dit():
    return DiTPipeline(
        transformer=build(1400, lambda: DiTTransformer2DModel(
            num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
            sample_size=16, patch_size=2, num_embeds_ada_norm=1000)),
        vae=build(1410, lambda: AutoencoderKL(**SD_VAE)),
        scheduler=DDIMScheduler(clip_sample=False))


def pixart_components(seed: int, sigma: bool) -> dict:
    shape = ({"num_attention_heads": 2, "cross_attention_dim": 16, "sample_size": 32} if sigma
             else {"num_attention_heads": 3, "cross_attention_dim": 24, "sample_size": 128})
    return {
        "transformer": build(seed, lambda: PixArtTransformer2DModel(
            attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2, caption_channels=32,
            patch_size=2, **shape)),
        "vae": build(seed + 10, lambda: AutoencoderKL(**(SD_VAE_8X if sigma else SD_VAE))),
        "text_encoder": build(seed + 20, lambda: T5EncoderModel(t5_config())),
        "tokenizer": t5_tokenizer(),
        "scheduler": DPMSolverMultistepScheduler(),
    }


# name: (builder, pipeline class, call kwargs)
CASES = {
    "dit": (dit, DiTPipeline, {"guidance_scale": 4.0}),
    "pixart-alpha": (lambda: PixArtAlphaPipeline(**pixart_components(1500, sigma=False)), PixArtAlphaPipeline,
                     {"negative_prompt": NEGATIVE, "guidance_scale": 4.5, "height": 32, "width": 48,
                      "use_resolution_binning": False, "clean_caption": False,
                      "max_sequence_length": MAX_SEQUENCE_LENGTH}),
    "pixart-sigma": (lambda: PixArtSigmaPipeline(**pixart_components(1600, sigma=True)), PixArtSigmaPipeline,
                     {"negative_prompt": NEGATIVE, "guidance_scale": 4.5, "height": 128, "width": 192,
                      "use_resolution_binning": True, "clean_caption": False,
                      "max_sequence_length": MAX_SEQUENCE_LENGTH}),
}


def write_bins() -> None:
    """The tables PixArt pipelines bin sizes to, keyed by the transformer's sample_size."""
    a, s = pipeline_pixart_alpha, pipeline_pixart_sigma
    tables = {"32": a.ASPECT_RATIO_256_BIN, "64": a.ASPECT_RATIO_512_BIN, "128": a.ASPECT_RATIO_1024_BIN,
              "256": s.ASPECT_RATIO_2048_BIN}
    out = {"_comment": f"diffusers {diffusers.__version__} pipeline_pixart_alpha / pipeline_pixart_sigma "
                       f"ASPECT_RATIO_*_BIN, keyed by the transformer's sample_size; written by {COMMAND}",
           **{k: {r: [int(v[0]), int(v[1])] for r, v in t.items()} for k, t in tables.items()}}
    BINS.write_text(json.dumps(out, indent=1) + "\n")


def tester_cases() -> dict:
    """DiT and PixArt-α as diffusers' own tests build them (`get_dummy_components`, read from
    tester_configs.json): the test's transformer and its all-default VAE and DDIM scheduler;
    PixArt's text encoder is this project's tiny T5 (the test loads
    hf-internal-testing/tiny-random-t5 from the Hub, which these cases never read)."""
    data = json.loads((Path(__file__).resolve().parent / "tester_configs.json").read_text())["diffusers"]
    dit_kw = data["dit"]["components"]["transformer"]["kwargs"]
    pixart_kw = data["pixart_alpha"]["components"]["transformer"]["kwargs"]

    def dit_tester():
        return DiTPipeline(transformer=build(1700, lambda: DiTTransformer2DModel(**dit_kw)),
                           vae=build(1710, lambda: AutoencoderKL()), scheduler=DDIMScheduler())

    def pixart_tester():
        return PixArtAlphaPipeline(
            transformer=build(1800, lambda: PixArtTransformer2DModel(**pixart_kw)),
            vae=build(1810, lambda: AutoencoderKL()),
            text_encoder=build(1820, lambda: T5EncoderModel(t5_config())), tokenizer=t5_tokenizer(),
            scheduler=DDIMScheduler())

    side = pixart_kw["sample_size"] * 8
    pixart_call = {"negative_prompt": NEGATIVE, "guidance_scale": 4.5, "height": side, "width": side,
                   "use_resolution_binning": False, "clean_caption": False,
                   "max_sequence_length": MAX_SEQUENCE_LENGTH}
    return {
        "tester-dit": (dit_tester, DiTPipeline, {"guidance_scale": 4.0}),
        "tester-pixart-alpha": (pixart_tester, PixArtAlphaPipeline, pixart_call),
        # test_inference_non_square_images, test_inference_with_multiple_images_per_prompt
        "tester-pixart-alpha-non-square": (pixart_tester, PixArtAlphaPipeline,
                                           {**pixart_call, "height": 32, "width": 48}),
        "tester-pixart-alpha-two-images": (pixart_tester, PixArtAlphaPipeline,
                                           {**pixart_call, "num_images_per_prompt": 2}),
    }


def run_case(index: int, name: str, builder, cls, call: dict, out: Path = OUT) -> dict:
    folder = out / name
    save(builder(), folder)
    if cls is DiTPipeline:
        index_path = folder / "model_index.json"
        model_index = json.loads(index_path.read_text())
        model_index["id2label"] = ID2LABEL
        index_path.write_text(json.dumps(model_index, indent=2) + "\n")
    pipe = cls.from_pretrained(folder, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    check_eval_f32(pipe)
    gen = torch.Generator().manual_seed(5200 + index)
    tr = pipe.transformer
    t: dict[str, torch.Tensor] = {}
    info: dict = {"name": name, "pipeline": cls.__name__}
    is_dit = cls is DiTPipeline

    with torch.no_grad():
        h = w = tr.config.sample_size
        if not is_dit:
            f = pipe.vae_scale_factor
            h, w = call["height"] // f, call["width"] // f
        t["transformer.hidden_states"] = torch.randn((2, tr.config.in_channels, h, w), generator=gen)
        t["transformer.timestep"] = torch.tensor(TIMESTEPS, dtype=torch.float32)
        timestep = torch.tensor(TIMESTEPS)
        if is_dit:
            t["transformer.class_labels"] = torch.tensor([207.0, 1000.0])
            t["transformer.out"] = tr(t["transformer.hidden_states"], timestep=timestep,
                                      class_labels=torch.tensor([207, 1000])).sample
        else:
            t["transformer.encoder_hidden_states"] = torch.randn(
                (2, MAX_SEQUENCE_LENGTH, tr.config.caption_channels), generator=gen)
            mask = torch.ones(2, MAX_SEQUENCE_LENGTH)
            mask[0, 5:] = 0
            mask[1, 11:] = 0
            t["transformer.encoder_attention_mask"] = mask
            added = {"resolution": None, "aspect_ratio": None}
            if tr.use_additional_conditions:
                t["transformer.resolution"] = torch.tensor([[32.0, 48.0], [1024.0, 768.0]])
                t["transformer.aspect_ratio"] = torch.tensor([[32 / 48], [1024 / 768]])
                added = {"resolution": t["transformer.resolution"], "aspect_ratio": t["transformer.aspect_ratio"]}
            t["transformer.out"] = tr(t["transformer.hidden_states"], timestep=timestep,
                                      encoder_hidden_states=t["transformer.encoder_hidden_states"],
                                      encoder_attention_mask=mask, added_cond_kwargs=added).sample
            # The mask matters: the padded positions change the output when unmasked.
            unmasked = tr(t["transformer.hidden_states"], timestep=timestep,
                          encoder_hidden_states=t["transformer.encoder_hidden_states"],
                          added_cond_kwargs=added).sample
            assert (unmasked - t["transformer.out"]).abs().max() > 100 * TOLERANCES["transformer"]

        vae = pipe.vae
        t["vae.latents"] = torch.randn((1, vae.config.latent_channels, 8, 12), generator=gen)
        t["vae.decoded"] = vae.decode(t["vae.latents"]).sample

        steps: list[float] = []
        if is_dit:
            info["labels"] = DIT_LABELS
            info["class_labels"] = pipe.get_label_ids(DIT_LABELS)
            with NoiseRecorder(6200 + index) as rec:
                image = pipe(info["class_labels"], num_inference_steps=STEPS, output_type="np", **call).images
            assert len(rec.draws) == 1, rec.callers
            t["pipe.latents"] = rec.draws[0]
            info["call"] = {"class_labels": info["class_labels"], "num_inference_steps": STEPS,
                            "output_type": "np", **call}
        else:
            (t["prompt_embeds"], t["prompt_attention_mask"], t["negative_prompt_embeds"],
             t["negative_prompt_attention_mask"]) = pipe.encode_prompt(
                PROMPT, True, negative_prompt=call["negative_prompt"], device=torch.device("cpu"),
                clean_caption=False, max_sequence_length=MAX_SEQUENCE_LENGTH)
            info["token_ids"] = {k: pipe.tokenizer(v.lower().strip(), padding="max_length",
                                                   max_length=MAX_SEQUENCE_LENGTH, truncation=True).input_ids
                                 for k, v in {"prompt": PROMPT, "negative_prompt": call["negative_prompt"]}.items()}
            lh, lw = call["height"], call["width"]
            if call["use_resolution_binning"]:
                bins = json.loads(BINS.read_text())[str(tr.config.sample_size)]
                lh, lw = pipe.image_processor.classify_height_width_bin(lh, lw, ratios=bins)
                info["binned_size"] = [lh, lw]
            f = pipe.vae_scale_factor
            images = call.get("num_images_per_prompt", 1)
            t["pipe.latents"] = torch.randn((images, tr.config.in_channels, lh // f, lw // f), generator=gen)
            with NoiseRecorder(6200 + index) as rec:
                image = pipe(PROMPT, num_inference_steps=STEPS, latents=t["pipe.latents"].clone(), output_type="np",
                             callback=lambda _i, ts, _l: steps.append(float(ts)), callback_steps=1, **call).images
            assert not rec.draws, rec.callers
            info["prompt"], info["negative_prompt"] = PROMPT, call["negative_prompt"]
            info["call"] = {"prompt": PROMPT, "num_inference_steps": STEPS, "latents": "pipe.latents",
                            "output_type": "np", **call}
            assert len(steps) == STEPS
            t["timesteps"] = torch.tensor(steps)
        t["pipe.image"] = torch.from_numpy(image).to(torch.float32)

    info["num_inference_steps"] = STEPS
    info["max_sequence_length"] = MAX_SEQUENCE_LENGTH
    info["tensors"] = {k: list(v.shape) for k, v in sorted(t.items())}
    info["tolerances"] = TOLERANCES
    info["library_versions"] = {p: importlib.metadata.version(p)
                                for p in ("torch", "transformers", "tokenizers", "diffusers", "safetensors")}
    info["command"] = COMMAND
    for k, v in t.items():
        assert torch.isfinite(v).all(), k
    save_file({k: v.contiguous().to(torch.float32) for k, v in sorted(t.items())}, folder / "expected.safetensors")
    (folder / "case.json").write_text(json.dumps(info, indent=1) + "\n")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{name}: {size / 1e6:.2f} MB, transformer.out std {t['transformer.out'].std():.4f}, image "
          f"{list(t['pipe.image'].shape)} std {t['pipe.image'].std():.4f}, timesteps {steps}")
    return {"bytes": size}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="writes the DiT and PixArt pipeline parity cases")
    parser.add_argument("--tester", action="store_true",
                        help="write the pipelines of diffusers' own tests (tester_cases) into --out instead")
    parser.add_argument("--out", type=Path, help="the folder of the tester cases")
    args = parser.parse_args()
    if args.tester and args.out is None:
        parser.error("--tester needs --out (a cache folder)")
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    diffusers.utils.logging.disable_progress_bar()
    out = args.out if args.tester else OUT
    out.mkdir(parents=True, exist_ok=True)
    cases = tester_cases() if args.tester else CASES
    if not args.tester:
        write_bins()
    total = 0
    for i, (name, (builder, cls, call)) in enumerate(cases.items()):
        total += run_case(100 * args.tester + i, name, builder, cls, call, out)["bytes"]
    print(f"wrote {len(cases)} cases to {out} ({total / 1e6:.2f} MB), diffusers {diffusers.__version__}")


if __name__ == "__main__":
    main()
