"""Writes diffusers/tests/data/pipelines/: one folder per case with a tiny random pipeline as
diffusers' `save_pretrained(..., safe_serialization=True)` lays it out (float32; model_index.json,
one folder per component), plus expected.safetensors and case.json: what diffusers computes with
that folder, reloaded by `from_pretrained`.

Cases: `sd15` (StableDiffusionPipeline + PNDM, also img2img), `sd2-vpred` (SD 2.x-shaped UNet:
linear projections, upcast attention, scale-shift resnets; DDIM v-prediction, trailing,
zero-terminal-SNR, guidance_rescale), `sdxl` (StableDiffusionXLPipeline, two text encoders,
text_time embedding; Euler) and `ddpm` (DDPMPipeline, UNet2DModel).

Every weight is random and then perturbed (norm weights and biases, and layers that diffusers
initialises to zero, included) so that each one changes the outputs. The tokenizer folders hold
the slow CLIP tokenizer files of hub/tests/data/clip_tokenizer/ (vocab.json, merges.txt,
tokenizer_config.json; no tokenizer.json), and the text encoders use that tokenizer's ids.

expected.safetensors holds, per case (float32):
  unet.sample, unet.timestep, unet.encoder_hidden_states (+ unet.text_embeds, unet.time_ids for
  sdxl) -> unet.out: the UNet alone;
  vae.latents -> vae.decoded (decode, no scaling); vae.image -> vae.mean, vae.logvar (encode);
  prompt_embeds, negative_prompt_embeds (+ pooled_prompt_embeds, negative_pooled_prompt_embeds
  for sdxl): what the pipeline's `encode_prompt` returns for the case's prompts;
  pipe.latents -> pipe.image: the whole pipeline (output_type "np"), timesteps: the timesteps
  its denoising loop ran (one entry per UNet call);
  sd15 also img2img.init_image -> img2img.image, img2img.timesteps, img2img.noise.N;
  sd15 also the VAE with `enable_tiling()` (its own sample_size 32: 32 px / 16 latent tiles,
  overlap factor 0.25; case.json "vae_tiled"): vae.tiled.latents [1, 4, 40, 24] -> vae.tiled.decoded
  (tiled_decode), vae.tiled.image [1, 3, 80, 48] -> vae.tiled.mean, vae.tiled.logvar (encode's
  latent_dist, built on _tiled_encode); inputs drawn last, from their own generator;
  ddpm: unet.sample, unet.timestep -> unet.out; pipe.noise.N -> pipe.image, timesteps.
Every tensor that diffusers' `randn_tensor` returns while a pipeline runs comes from a recorder
with a fixed generator; the ones the pipeline uses are stored as `*.noise.N` (call order), and
case.json says what each one is, so a port that takes the noise as an input reproduces diffusers.

Run: .venv/bin/python nightly/reference/pipelines.py
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (AutoTokenizer, CLIPTextConfig, CLIPTextModel,  # noqa: E402
                          CLIPTextModelWithProjection)

import diffusers  # noqa: E402
from diffusers import (AutoencoderKL, DDIMScheduler, DDPMPipeline, DDPMScheduler,  # noqa: E402
                       EulerAncestralDiscreteScheduler, EulerDiscreteScheduler, LMSDiscreteScheduler,
                       PNDMScheduler, StableDiffusionImg2ImgPipeline,
                       StableDiffusionPipeline, StableDiffusionXLPipeline, UNet2DConditionModel,
                       UNet2DModel)
from diffusers.utils import torch_utils  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "diffusers/tests/data/pipelines"
TOKENIZER = ROOT / "hub/tests/data/clip_tokenizer"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
COMMAND = ".venv/bin/python nightly/reference/pipelines.py"

# Every word of these is in the test tokenizer's vocabulary (no byte-level pieces).
PROMPT = "a photo of a red dog and a cat in the world"
NEGATIVE = "hello"
HEIGHT = WIDTH = 32
STEPS = 3
UNET_TIMESTEP = 37
PERTURB = 0.05  # added to every parameter: std of the Gaussian perturbation
TOLERANCES = {"unet": 1e-4, "vae": 1e-4, "image": 1e-3}

SD_BETAS = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}

VAE = {"block_out_channels": [16, 32], "in_channels": 3, "out_channels": 3,
       "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
       "latent_channels": 4, "norm_num_groups": 8, "sample_size": 32}


def tokenizer_ids() -> dict:
    vocab = json.loads((TOKENIZER / "vocab.json").read_text())
    return {"vocab_size": len(vocab), "bos_token_id": vocab["<|startoftext|>"],
            "eos_token_id": vocab["<|endoftext|>"], "pad_token_id": vocab["<|endoftext|>"],
            "max_position_embeddings": 16}


def text_config(hidden: int, act: str, projection_dim: int | None = None) -> CLIPTextConfig:
    extra = {"projection_dim": projection_dim} if projection_dim is not None else {}
    return CLIPTextConfig(hidden_size=hidden, intermediate_size=37, num_hidden_layers=5, num_attention_heads=2,
                          layer_norm_eps=1e-5, hidden_act=act, **tokenizer_ids(), **extra)


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Adds Gaussian noise to every parameter, so none is zero, one or otherwise inert."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(PERTURB * torch.randn_like(p))
    return model.eval()


def build(seed: int, make) -> torch.nn.Module:
    torch.manual_seed(seed)
    return perturbed(make(), seed + 1)


class NoiseRecorder:
    """Replaces diffusers' `randn_tensor` in every module that imported it with draws from a fixed
    generator, and records each draw (shape, dtype, caller) in call order."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self.draws: list[torch.Tensor] = []
        self.callers: list[str] = []

    def __enter__(self):
        original = torch_utils.randn_tensor
        self.patched = [m for m in list(sys.modules.values())
                        if getattr(m, "__name__", "").startswith("diffusers")
                        and getattr(m, "randn_tensor", None) is original]
        self.original = original

        def draw(shape, generator=None, device=None, dtype=None, layout=None, **_kwargs):
            assert generator is None, "pipelines here run without a generator"
            t = torch.randn(tuple(shape), generator=self.gen, dtype=torch.float32)
            self.draws.append(t.clone())
            self.callers.append(sys._getframe(1).f_code.co_qualname)
            return t.to(device=device or "cpu", dtype=dtype or torch.float32)

        for m in self.patched:
            m.randn_tensor = draw
        return self

    def __exit__(self, *exc):
        for m in self.patched:
            m.randn_tensor = self.original


class StepRecorder:
    """callback_on_step_end that keeps the timestep of each denoising iteration."""

    def __init__(self):
        self.timesteps: list[float] = []

    def __call__(self, _pipe, _i, t, kwargs):
        self.timesteps.append(float(t))
        return kwargs


def sd15():
    unet = build(0, lambda: UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=2, norm_num_groups=8))
    vae = build(10, lambda: AutoencoderKL(**VAE))
    text_encoder = build(20, lambda: CLIPTextModel(text_config(16, "quick_gelu")))
    scheduler = PNDMScheduler(**SD_BETAS, skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
    return StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
                                   unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def sd2_vpred():
    unet = build(100, lambda: UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=(2, 4, 4), use_linear_projection=True, upcast_attention=True, cross_attention_dim=16,
        norm_num_groups=8, resnet_time_scale_shift="scale_shift", flip_sin_to_cos=False, freq_shift=1))
    vae = build(110, lambda: AutoencoderKL(**VAE, scaling_factor=0.13025, force_upcast=False))
    text_encoder = build(120, lambda: CLIPTextModel(text_config(16, "gelu")))
    # steps_offset=1 as SD ships it: StableDiffusionPipeline rewrites any other value to 1 (a
    # deprecation path); with "trailing" spacing DDIM ignores it anyway.
    scheduler = DDIMScheduler(**SD_BETAS, prediction_type="v_prediction", timestep_spacing="trailing",
                              rescale_betas_zero_snr=True, clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    return StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
                                   unet=unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def sdxl():
    te1, te2 = text_config(16, "quick_gelu"), text_config(24, "gelu", projection_dim=12)
    unet = build(200, lambda: UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2), attention_head_dim=(2, 4), use_linear_projection=True,
        cross_attention_dim=te1.hidden_size + te2.hidden_size, norm_num_groups=8,
        addition_embed_type="text_time", addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + te2.projection_dim))
    vae = build(210, lambda: AutoencoderKL(**VAE, scaling_factor=0.13025))
    text_encoder = build(220, lambda: CLIPTextModel(te1))
    text_encoder_2 = build(230, lambda: CLIPTextModelWithProjection(te2))
    scheduler = EulerDiscreteScheduler(**SD_BETAS, timestep_spacing="leading", steps_offset=1)
    return StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                                     tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
                                     tokenizer_2=AutoTokenizer.from_pretrained(TOKENIZER), unet=unet,
                                     scheduler=scheduler, add_watermarker=False)


def ddpm():
    unet = build(300, lambda: UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8))
    return DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=1000))


def tester_pipelines() -> dict:
    """The pipelines of diffusers' own tests (`get_dummy_components` in
    tests/pipelines/<pipeline>/test_*.py, read as data from tester_configs.json): name ->
    (builder, call kwargs, kind). Their text encoders take this project's CLIP tokenizer's
    ids (the tests load hf-internal-testing/tiny-random-clip from the Hub, which these cases
    never read): vocabulary, bos, eos and pad ids are the tokenizer's, the rest the test's."""
    data = json.loads((Path(__file__).resolve().parent / "tester_configs.json").read_text())["diffusers"]
    ids = {k: v for k, v in tokenizer_ids().items() if k != "max_position_embeddings"}
    schedulers = {"DDIMScheduler": DDIMScheduler, "EulerDiscreteScheduler": EulerDiscreteScheduler,
                  "DDPMScheduler": DDPMScheduler, "PNDMScheduler": PNDMScheduler}

    def part(entry: dict, key: str) -> dict:
        return entry["components"][key]["kwargs"]

    def encoder(entry: dict, key: str, cls):
        return cls(CLIPTextConfig(**{**part(entry, key), **ids}))

    def scheduler(entry: dict):
        c = entry["components"]["scheduler"]
        return schedulers[c["class"]](**c["kwargs"])

    def sd(key: str, seed: int, swap=None):
        """The test's pipeline; `swap` turns its scheduler into a variant's."""
        e = data[key]

        def make():
            unet = build(seed, lambda: UNet2DConditionModel(**part(e, "unet")))
            vae = build(seed + 10, lambda: AutoencoderKL(**part(e, "vae")))
            te = build(seed + 20, lambda: encoder(e, "text_encoder", CLIPTextModel))
            sched = scheduler(e)
            return StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
                                           unet=unet, scheduler=swap(sched) if swap else sched, safety_checker=None,
                                           feature_extractor=None, requires_safety_checker=False)
        return make

    def sdxl_make():
        e = data["stable_diffusion_xl"]
        unet = build(1200, lambda: UNet2DConditionModel(**part(e, "unet")))
        vae = build(1210, lambda: AutoencoderKL(**part(e, "vae")))
        te = build(1220, lambda: encoder(e, "text_encoder", CLIPTextModel))
        te2 = build(1230, lambda: encoder(e, "text_encoder_2", CLIPTextModelWithProjection))
        return StableDiffusionXLPipeline(vae=vae, text_encoder=te, text_encoder_2=te2,
                                         tokenizer=AutoTokenizer.from_pretrained(TOKENIZER),
                                         tokenizer_2=AutoTokenizer.from_pretrained(TOKENIZER), unet=unet,
                                         scheduler=scheduler(e), add_watermarker=False)

    def ddpm_make(**scheduler_overrides):
        def make():
            e = data["ddpm"]
            unet = build(1300, lambda: UNet2DModel(**part(e, "unet")))
            c = e["components"]["scheduler"]
            return DDPMPipeline(unet=unet, scheduler=schedulers[c["class"]](**{**c["kwargs"], **scheduler_overrides}))
        return make

    guidance = {k: data[k]["inputs"].get("guidance_scale") for k in data}
    cases = {
        "tester-sd15": (sd("stable_diffusion", 1000), {"guidance_scale": guidance["stable_diffusion"]}, "sd15"),
        "tester-sd2": (sd("stable_diffusion_2", 1100), {"guidance_scale": guidance["stable_diffusion_2"]},
                       "sd2-vpred"),
        "tester-sdxl": (sdxl_make, {"guidance_scale": guidance["stable_diffusion_xl"]}, "sdxl"),
        "tester-ddpm": (ddpm_make(), {}, "ddpm"),
        # test_inference_predict_sample
        "tester-ddpm-predict-sample": (ddpm_make(prediction_type="sample"), {}, "ddpm"),
    }
    # The SD tests' variants (their `variants` in tester_configs.json): the scheduler swapped
    # (from the test's DDIM config, or PNDM's defaults as the tests build it), other sizes and
    # step counts, SD 2's "unflawed" trailing DDIM with guidance_rescale.
    swaps = {
        "pndm": lambda _c: PNDMScheduler(skip_prk_steps=True),
        "k-lms": lambda c: LMSDiscreteScheduler.from_config(c.config),
        "k-euler-ancestral": lambda c: EulerAncestralDiscreteScheduler.from_config(c.config),
        "k-euler": lambda c: EulerDiscreteScheduler.from_config(c.config),
    }
    for key, short, seed, kind in (("stable_diffusion", "sd15", 1000, "sd15"),
                                   ("stable_diffusion_2", "sd2", 1100, "sd2-vpred")):
        call = {"guidance_scale": guidance[key]}
        for variant, swap in swaps.items():
            cases[f"tester-{short}-{variant}"] = (sd(key, seed, swap), call, kind)
    sd_call = {"guidance_scale": guidance["stable_diffusion"]}
    cases["tester-sd15-factor-8"] = (sd("stable_diffusion", 1000), {**sd_call, "height": 136, "width": 136}, "sd15")
    cases["tester-sd15-height-width-opt"] = (
        sd("stable_diffusion", 1000, lambda c: LMSDiscreteScheduler.from_config(c.config)),
        {**sd_call, "num_inference_steps": 1, "height": 96, "width": 96}, "sd15")
    cases["tester-sd2-unflawed"] = (
        sd("stable_diffusion_2", 1100, lambda c: DDIMScheduler.from_config(c.config, timestep_spacing="trailing")),
        {"guidance_scale": guidance["stable_diffusion_2"], "guidance_rescale": 0.7, "num_inference_steps": 10},
        "sd2-vpred")
    return cases


# name: (builder, pipeline call kwargs beyond the common ones)
CASES = {
    "sd15": (sd15, {"guidance_scale": 6.0}),
    "sd2-vpred": (sd2_vpred, {"guidance_scale": 7.5, "guidance_rescale": 0.7}),
    "sdxl": (sdxl, {"guidance_scale": 5.0}),
    "ddpm": (ddpm, {}),
}

IMG2IMG = {"strength": 0.6, "num_inference_steps": 4, "guidance_scale": 6.0}


def save(pipe, folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    pipe.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer", "tokenizer_2"):
        if (folder / name).exists():
            shutil.rmtree(folder / name)
            (folder / name).mkdir()
            for f in TOKENIZER_FILES:
                shutil.copyfile(TOKENIZER / f, folder / name / f)


def check_eval_f32(pipe) -> None:
    for name, module in pipe.components.items():
        if isinstance(module, torch.nn.Module):
            assert not any(m.training for m in module.modules()), f"{name} is in training mode"
            assert all(p.dtype == torch.float32 for p in module.parameters()), f"{name} is not float32"


def vae_tiled(vae, gen: torch.Generator, t: dict) -> dict:
    """Tiled VAE decode and encode (`enable_tiling()`, the VAE's own tile sizes) on inputs larger
    than one tile in both directions and not square, so that several overlapping tiles are blended
    each way; checks that the outputs differ from untiled ones, then turns tiling off again."""
    tiles = {"tile_sample_min_size": vae.tile_sample_min_size, "tile_latent_min_size": vae.tile_latent_min_size,
             "tile_overlap_factor": vae.tile_overlap_factor}
    assert tiles == {"tile_sample_min_size": 32, "tile_latent_min_size": 16, "tile_overlap_factor": 0.25}, tiles
    t["vae.tiled.latents"] = torch.randn((1, 4, 40, 24), generator=gen)
    t["vae.tiled.image"] = torch.rand((1, 3, 80, 48), generator=gen) * 2 - 1
    assert not vae.use_tiling
    plain = vae.decode(t["vae.tiled.latents"]).sample
    plain_dist = vae.encode(t["vae.tiled.image"]).latent_dist
    vae.enable_tiling()
    try:
        t["vae.tiled.decoded"] = vae.decode(t["vae.tiled.latents"]).sample
        # encode -> _encode -> _tiled_encode (the moments), wrapped in DiagonalGaussianDistribution
        # by encode() itself; the deprecated public tiled_encode is not on this path.
        dist = vae.encode(t["vae.tiled.image"]).latent_dist
        t["vae.tiled.mean"], t["vae.tiled.logvar"] = dist.mean, dist.logvar
    finally:
        vae.disable_tiling()
    diffs = {"decoded": (t["vae.tiled.decoded"] - plain).abs().max().item(),
             "mean": (t["vae.tiled.mean"] - plain_dist.mean).abs().max().item(),
             "logvar": (t["vae.tiled.logvar"] - plain_dist.logvar).abs().max().item()}
    assert t["vae.tiled.decoded"].shape == plain.shape == (1, 3, 80, 48), plain.shape
    assert t["vae.tiled.mean"].shape == plain_dist.mean.shape == (1, 4, 40, 24), plain_dist.mean.shape
    for k, d in diffs.items():
        assert d > 100 * TOLERANCES["vae"], f"tiled {k} is within {d} of untiled"
    print("  vae tiled vs untiled max abs diff: " + ", ".join(f"{k} {d:.4g}" for k, d in diffs.items()))
    return {**tiles, "untiled_max_abs_diff": {k: float(f"{d:.6g}") for k, d in diffs.items()},
            "notes": "vae.enable_tiling(); decode -> tiled_decode (latent tiles of tile_latent_min_size, "
                     "stride int(tile_latent_min_size * (1 - overlap)), blend int(tile_sample_min_size * overlap) "
                     "px); encode -> _tiled_encode (image tiles of tile_sample_min_size, stride "
                     "int(tile_sample_min_size * (1 - overlap)), blend int(tile_latent_min_size * overlap)), "
                     "then DiagonalGaussianDistribution"}


def run_case(index: int, name: str, builder, call: dict, kind: str | None = None, out: Path = OUT) -> dict:
    """Writes case `name` into `out`; `kind` (default: the name) says which of the four
    pipelines it is."""
    kind = kind or name
    folder = out / name
    save(builder(), folder)
    is_ddpm = kind == "ddpm"
    cls = {"sd15": StableDiffusionPipeline, "sd2-vpred": StableDiffusionPipeline,
           "sdxl": StableDiffusionXLPipeline, "ddpm": DDPMPipeline}[kind]
    pipe = cls.from_pretrained(folder, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    check_eval_f32(pipe)
    gen = torch.Generator().manual_seed(5000 + index)
    t: dict[str, torch.Tensor] = {}
    info: dict = {"name": name, "pipeline": cls.__name__}

    with torch.no_grad():
        unet = pipe.unet
        if is_ddpm:
            t["unet.sample"] = torch.randn((2, 3, 16, 16), generator=gen)
            t["unet.timestep"] = torch.tensor([float(UNET_TIMESTEP)])
            t["unet.out"] = unet(t["unet.sample"], t["unet.timestep"]).sample
        else:
            seq = pipe.tokenizer.model_max_length
            t["unet.sample"] = torch.randn((2, 4, 16, 16), generator=gen)
            t["unet.timestep"] = torch.tensor([float(UNET_TIMESTEP)])
            t["unet.encoder_hidden_states"] = torch.randn((2, seq, unet.config.cross_attention_dim), generator=gen)
            added = None
            if kind == "sdxl":
                t["unet.text_embeds"] = torch.randn((2, pipe.text_encoder_2.config.projection_dim), generator=gen)
                t["unet.time_ids"] = torch.tensor([[32.0, 32.0, 0.0, 0.0, 32.0, 32.0],
                                                   [48.0, 40.0, 4.0, 2.0, 32.0, 32.0]])
                added = {"text_embeds": t["unet.text_embeds"], "time_ids": t["unet.time_ids"]}
            t["unet.out"] = unet(t["unet.sample"], t["unet.timestep"], t["unet.encoder_hidden_states"],
                                 added_cond_kwargs=added).sample

            vae = pipe.vae
            t["vae.latents"] = torch.randn((1, 4, 16, 16), generator=gen)
            t["vae.decoded"] = vae.decode(t["vae.latents"]).sample
            t["vae.image"] = torch.rand((1, 3, 32, 32), generator=gen) * 2 - 1
            dist = vae.encode(t["vae.image"]).latent_dist
            t["vae.mean"], t["vae.logvar"] = dist.mean, dist.logvar

            if kind == "sdxl":
                (t["prompt_embeds"], t["negative_prompt_embeds"], t["pooled_prompt_embeds"],
                 t["negative_pooled_prompt_embeds"]) = pipe.encode_prompt(
                    PROMPT, device=torch.device("cpu"), num_images_per_prompt=1, do_classifier_free_guidance=True,
                    negative_prompt=NEGATIVE)
            else:
                t["prompt_embeds"], t["negative_prompt_embeds"] = pipe.encode_prompt(
                    PROMPT, torch.device("cpu"), 1, True, negative_prompt=NEGATIVE)
            info["prompt"], info["negative_prompt"] = PROMPT, NEGATIVE
            info["prompt_ids"] = pipe.tokenizer(PROMPT, padding="max_length", max_length=seq,
                                                truncation=True).input_ids
            info["negative_prompt_ids"] = pipe.tokenizer(NEGATIVE, padding="max_length", max_length=seq,
                                                         truncation=True).input_ids

        # A variant's own step count and size, else the cases' common ones.
        n_steps = call.get("num_inference_steps", STEPS)
        height, width = call.get("height", HEIGHT), call.get("width", WIDTH)
        extra = {k: v for k, v in call.items() if k not in ("num_inference_steps", "height", "width")}
        info["num_inference_steps"] = n_steps
        info.update(extra)
        side = pipe.unet.config.sample_size if is_ddpm else None
        info["height"], info["width"] = (side, side) if is_ddpm else (height, width)
        info["unet_timestep"] = UNET_TIMESTEP

        if is_ddpm:
            with NoiseRecorder(6000 + index) as rec:
                image = pipe(num_inference_steps=n_steps, output_type="np").images
            t["timesteps"] = pipe.scheduler.timesteps.to(torch.float32)
            for i, n in enumerate(rec.draws):
                t[f"pipe.noise.{i}"] = n
            steps = [int(x) for x in pipe.scheduler.timesteps]
            info["noise"] = [f"initial sample {list(rec.draws[0].shape)} (DDPMPipeline.__call__)"] + [
                f"variance noise of scheduler.step at t={s} {list(n.shape)} (DDPMScheduler.step)"
                for s, n in zip(steps, rec.draws[1:])]
            assert len(rec.draws) == 1 + sum(s > 0 for s in steps), rec.callers
            assert rec.callers == ["DDPMPipeline.__call__"] + ["DDPMScheduler.step"] * (len(rec.draws) - 1), rec.callers
        else:
            scale = pipe.vae_scale_factor
            t["pipe.latents"] = torch.randn((1, 4, height // scale, width // scale), generator=gen)
            steps = StepRecorder()
            with NoiseRecorder(6000 + index) as rec:
                image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=n_steps, height=height,
                             width=width, latents=t["pipe.latents"].clone(), output_type="np",
                             callback_on_step_end=steps, **extra).images
            t["timesteps"] = torch.tensor(steps.timesteps, dtype=torch.float32)
            # latents= is the only noise but for an ancestral scheduler's steps (PNDM, DDIM with
            # eta 0, Euler with s_churn 0 and LMS draw none): each draw recorded in order.
            assert all(c.endswith("Scheduler.step") for c in rec.callers), rec.callers
            for i, n in enumerate(rec.draws):
                t[f"pipe.noise.{i}"] = n
            if rec.draws:
                info["noise"] = [f"noise of scheduler.step {i} {list(n.shape)} ({c})"
                                 for i, (n, c) in enumerate(zip(rec.draws, rec.callers))]
            info["timesteps"] = "one entry per denoising iteration (UNet call), from callback_on_step_end"
            if name == "sd15":
                info["timesteps"] += "; PNDM with skip_prk_steps runs num_inference_steps + 1 iterations, " \
                                     "repeating the second timestep"
            if kind == "sdxl":
                info["add_time_ids"] = [HEIGHT, WIDTH, 0, 0, HEIGHT, WIDTH]
                info["notes"] = ("time_ids = original_size + crops_coords_top_left + target_size, the same row for "
                                 "the negative and positive halves; text_embeds = cat(negative_pooled, pooled); "
                                 "prompt_embeds of both encoders are hidden_states[-2] (no final_layer_norm), "
                                 "concatenated on the last dim; pooled = text_encoder_2's text_embeds")
        t["pipe.image"] = torch.from_numpy(image).to(torch.float32)

        if name == "sd15":
            img = StableDiffusionImg2ImgPipeline(**pipe.components)
            img.set_progress_bar_config(disable=True)
            t["img2img.init_image"] = torch.rand((1, 3, HEIGHT, WIDTH), generator=gen)
            steps = StepRecorder()
            with NoiseRecorder(7000 + index) as rec:
                out = img(PROMPT, image=t["img2img.init_image"].clone(), negative_prompt=NEGATIVE,
                          output_type="np", callback_on_step_end=steps, **IMG2IMG).images
            t["img2img.image"] = torch.from_numpy(out).to(torch.float32)
            t["img2img.timesteps"] = torch.tensor(steps.timesteps, dtype=torch.float32)
            for i, n in enumerate(rec.draws):
                t[f"img2img.noise.{i}"] = n
            assert rec.callers == ["DiagonalGaussianDistribution.sample",
                                   "StableDiffusionImg2ImgPipeline.prepare_latents"], rec.callers
            info["img2img"] = {**IMG2IMG, "noise": [
                f"posterior sample noise {list(rec.draws[0].shape)}: vae.encode(image).latent_dist.sample() = "
                "mean + exp(0.5 * logvar) * noise.0, then times vae scaling_factor (prepare_latents)",
                f"added noise {list(rec.draws[1].shape)}: scheduler.add_noise(init_latents, noise.1, timesteps[0]) "
                "(prepare_latents)"],
                "image_preprocess": "the [0, 1] tensor becomes 2 * image - 1 (VaeImageProcessor.preprocess)",
                "timesteps": "scheduler.timesteps[t_start:] with t_start = num_inference_steps - "
                             "int(num_inference_steps * strength); the first one is add_noise's timestep"}

        if name == "sd15":
            info["vae_tiled"] = vae_tiled(pipe.vae, torch.Generator().manual_seed(8000 + index), t)

    info["tolerances"] = TOLERANCES
    info["library_versions"] = {p: importlib.metadata.version(p)
                                for p in ("torch", "transformers", "diffusers", "safetensors")}
    info["command"] = COMMAND
    save_file({k: v.contiguous().to(torch.float32) for k, v in sorted(t.items())}, folder / "expected.safetensors")
    (folder / "case.json").write_text(json.dumps(info, indent=1) + "\n")

    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"{name}: {size / 1e6:.2f} MB, unet.out abs mean {t['unet.out'].abs().mean():.4f} "
          f"std {t['unet.out'].std():.4f}, image std {t['pipe.image'].std():.4f} "
          f"min {t['pipe.image'].min():.3f} max {t['pipe.image'].max():.3f}, timesteps {t['timesteps'].tolist()}")
    if "vae.decoded" in t:
        print(f"  vae.decoded std {t['vae.decoded'].std():.4f}, vae.mean std {t['vae.mean'].std():.4f}, "
              f"logvar mean {t['vae.logvar'].mean():.4f}, prompt_embeds std {t['prompt_embeds'].std():.4f}")
    if "img2img.image" in t:
        print(f"  img2img.image std {t['img2img.image'].std():.4f}, timesteps {t['img2img.timesteps'].tolist()}")
    for k, v in sorted(t.items()):
        print(f"    {k} {list(v.shape)}")
    return {"name": name, "bytes": size}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="writes the pipeline parity cases")
    parser.add_argument("--tester", action="store_true",
                        help="write the pipelines of diffusers' own tests (tester_pipelines) instead; needs --out")
    parser.add_argument("--out", type=Path, help=f"the folder of the cases (default {OUT})")
    args = parser.parse_args()
    if args.tester and args.out is None:
        parser.error("--tester needs --out (a cache folder)")
    out = args.out or OUT
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    if args.tester:
        for i, (name, (builder, call, kind)) in enumerate(tester_pipelines().items()):
            total += run_case(100 + i, name, builder, call, kind, out)["bytes"]
    else:
        for i, (name, (builder, call)) in enumerate(CASES.items()):
            total += run_case(i, name, builder, call, out=out)["bytes"]
    print(f"wrote {out} ({total / 1e6:.2f} MB), diffusers {diffusers.__version__}")


if __name__ == "__main__":
    main()
