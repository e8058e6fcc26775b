"""Writes the flow-matching cases of diffusers/tests/data/pipelines/: one folder per case with a
tiny random pipeline as diffusers' `save_pretrained(..., safe_serialization=True)` lays it out
(float32; model_index.json, one folder per component), plus expected.safetensors and case.json:
what diffusers computes with that folder, reloaded by `from_pretrained(folder, dtype=float32)`.
The conventions, helpers and prompts are those of pipelines.py (its folders are left alone).

Cases:
  `sd3`      StableDiffusion3Pipeline: SD3Transformer2DModel (2 joint blocks, pos_embed_max_size 12
             cropped to the 8x8 patch grid), two CLIPTextModelWithProjection (hidden 8 quick_gelu,
             hidden 16 gelu), T5EncoderModel (d_model 32 = joint_attention_dim, so the 8 + 16 = 24
             CLIP channels are zero-padded), 16-channel AutoencoderKL with shift_factor,
             FlowMatchEulerDiscreteScheduler(shift=3.0); CFG 5.0 with a negative prompt; also the
             same call without T5 (text_encoder_3 = tokenizer_3 = None);
  `sd35`     as sd3 with qk_norm "rms_norm", dual_attention_layers (0,), 3 blocks, and skip-layer
             guidance (skip_guidance_layers [1], scale 2.8, start 0.0, stop 1.0);
  `flux`     FluxPipeline: FluxTransformer2DModel (1 double, 2 single blocks, rope axes (2, 2, 4)),
             CLIPTextModel (pooled output only), T5EncoderModel, 4-channel AutoencoderKL,
             FlowMatchEulerDiscreteScheduler with dynamic shifting (mu from the image sequence
             length); true CFG (true_cfg_scale 4.0, negative prompt);
  `flux-dev` as flux with guidance_embeds (guidance_scale 3.5), no negative prompt, 4 steps;
  `sd3-crop` as sd3 with CLIP encoders of hidden 16 and 24, together wider than
             joint_attention_dim 32 (as diffusers' own tiny SD3 test pipeline): the pipeline
             crops their 40 channels to 32 (F.pad with a negative width).

Every weight is random and then perturbed (pipelines.perturbed: norm weights and biases, and
layers that diffusers initialises to zero, included); so is every floating buffer that the
checkpoint stores (the SD3 transformer's `pos_embed.pos_embed`, the 2-D sin-cos table of
pos_embed_max_size^2 positions), so a port must load it rather than recompute it. CLIP
tokenizer folders hold the slow CLIP tokenizer files of hub/tests/data/clip_tokenizer/
(vocab.json, merges.txt, tokenizer_config.json; model_max_length 16 = the text encoders'
max_position_embeddings, which is the CLIP length both pipelines pad to); T5 tokenizer folders
hold transformers/tests/data/t5_tokenizer/ (tokenizer.json, tokenizer_config.json) and the T5
configs use its ids (vocab_size = len(tokenizer) = 129 with the 4 sentinels, pad 0, eos 1).
max_sequence_length is 16 for T5. Height = width = 32 px.

expected.safetensors holds, per case (float32):
  SD3 cases (sd3, sd35, sd3-crop):
    transformer.hidden_states [2, 16, 16, 16], transformer.timestep [2] (37.0, 912.5: the
    0..1000 scale SD3 passes), transformer.encoder_hidden_states [2, 32, 32] (16 CLIP + 16 T5
    positions, joint_attention_dim 32), transformer.pooled_projections [2, 24] -> transformer.out
    [2, 16, 16, 16]; transformer.out_skip: the same inputs with skip_layers=[1];
  Flux cases (flux, flux-dev):
    transformer.hidden_states [1, 64, 16] (packed 2x2 patches of a [1, 4, 16, 16] latent),
    transformer.encoder_hidden_states [1, 16, 32], transformer.pooled_projections [1, 16],
    transformer.timestep [1] (0.37: Flux multiplies it by 1000 inside), transformer.img_ids
    [64, 3] (FluxPipeline._prepare_latent_image_ids: (0, row, col)), transformer.txt_ids [16, 3]
    (zeros, as encode_prompt builds them), + transformer.guidance [1] (3.5, also times 1000
    inside) for flux-dev -> transformer.out [1, 64, 16];
  all cases:
    vae.latents -> vae.decoded (plain vae.decode: no scaling_factor, no shift_factor);
    vae.image [1, 3, 32, 32] -> vae.mean, vae.logvar (encode's latent_dist);
    what the pipeline's `encode_prompt` returns for the case's prompts:
      SD3: prompt_embeds, negative_prompt_embeds [1, 32, 32], pooled_prompt_embeds,
      negative_pooled_prompt_embeds [1, 24];
      Flux: prompt_embeds [1, 16, 32], pooled_prompt_embeds [1, 16], text_ids [16, 3]
      (+ negative_prompt_embeds, negative_pooled_prompt_embeds for flux: encode_prompt of the
      negative prompt, as true CFG calls it);
    pipe.latents -> pipe.image [1, 32, 32, 3]: the whole pipeline (output_type "np"); SD3
    latents are [1, 16, 16, 16]; Flux takes them packed, pipe.latents [1, 64, 16], and
    pipe.latents_unpacked [1, 4, 16, 16] is the same tensor before FluxPipeline._pack_latents;
    timesteps: the timestep of each denoising iteration (callback_on_step_end), sigmas:
    scheduler.sigmas after the run (the terminal 0 appended);
  sd3 also no_t5.prompt_embeds [1, 32, 32] (encode_prompt without T5: its 16 positions are
  zeros) and no_t5.image: the same call, same latents, with text_encoder_3 = tokenizer_3 = None.
No pipeline here draws noise (latents are given, FlowMatch Euler is deterministic): diffusers'
`randn_tensor` is replaced by a recorder while they run, and the script asserts it is not called.

Run: .venv/bin/python nightly/reference/flow_pipelines.py [CASE...]
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (AutoTokenizer, CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection,  # noqa: E402
                          T5Config, T5EncoderModel)

import diffusers  # noqa: E402
import transformers  # noqa: E402
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,  # noqa: E402
                       FluxTransformer2DModel, SD3Transformer2DModel, StableDiffusion3Pipeline)
from pipelines import (HEIGHT, NEGATIVE, PERTURB, PROMPT, TOKENIZER, TOKENIZER_FILES,  # noqa: E402
                       WIDTH, NoiseRecorder, StepRecorder, build, check_eval_f32, text_config, tokenizer_ids)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "diffusers/tests/data/pipelines"
T5_TOKENIZER = ROOT / "transformers/tests/data/t5_tokenizer"
T5_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
COMMAND = ".venv/bin/python nightly/reference/flow_pipelines.py"

STEPS = 3
MAX_SEQUENCE_LENGTH = 16
SD3_TIMESTEPS = [37.0, 912.5]
FLUX_TIMESTEP = 0.37
TOLERANCES = {"transformer": 1e-4, "vae": 1e-4, "image": 1e-3}

VAE = {"block_out_channels": [16, 32], "in_channels": 3, "out_channels": 3,
       "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
       "norm_num_groups": 8, "sample_size": 32, "use_quant_conv": False, "use_post_quant_conv": False}
SD3_VAE = {**VAE, "latent_channels": 16, "scaling_factor": 1.5305, "shift_factor": 0.0609}
FLUX_VAE = {**VAE, "latent_channels": 4, "scaling_factor": 0.3611, "shift_factor": 0.1159}


def t5_tokenizer():
    return AutoTokenizer.from_pretrained(T5_TOKENIZER)


def t5_config() -> T5Config:
    tok = t5_tokenizer()
    return T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20,
                    feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_gated_act=True,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=0)


def with_buffers(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Perturbs the floating buffers the checkpoint stores (those in the state dict that are not
    parameters) as pipelines.perturbed does parameters."""
    params = {n for n, _ in model.named_parameters()}
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, b in sorted(model.state_dict().items()):
            if n not in params and b.is_floating_point():
                b.add_(PERTURB * torch.randn_like(b))
    return model


def persistent_buffers(model: torch.nn.Module) -> list[str]:
    params = {n for n, _ in model.named_parameters()}
    return sorted(n for n, b in model.state_dict().items() if n not in params and b.is_floating_point())


def sd3_components(seed: int, sd35: bool) -> dict:
    extra = {"qk_norm": "rms_norm", "dual_attention_layers": (0,)} if sd35 else {}
    transformer = with_buffers(build(seed, lambda: SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=3 if sd35 else 2,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
        pooled_projection_dim=24, pos_embed_max_size=12, **extra)), seed + 2)
    return {
        "transformer": transformer,
        "vae": build(seed + 10, lambda: AutoencoderKL(**SD3_VAE)),
        "text_encoder": build(seed + 20, lambda: CLIPTextModelWithProjection(text_config(8, "quick_gelu", 12))),
        "text_encoder_2": build(seed + 30, lambda: CLIPTextModelWithProjection(text_config(16, "gelu", 12))),
        "text_encoder_3": build(seed + 40, lambda: T5EncoderModel(t5_config())),
        "tokenizer": AutoTokenizer.from_pretrained(TOKENIZER),
        "tokenizer_2": AutoTokenizer.from_pretrained(TOKENIZER),
        "tokenizer_3": t5_tokenizer(),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
    }


def sd3():
    return StableDiffusion3Pipeline(**sd3_components(1000, sd35=False))


def sd35():
    return StableDiffusion3Pipeline(**sd3_components(1100, sd35=True))


def sd3_crop():
    # As diffusers' own tiny SD3 (tests/pipelines/stable_diffusion_3): CLIP encoders 16 + 24 =
    # 40 wide together, past joint_attention_dim 32; the pipeline's F.pad with a negative
    # width crops their hidden states to it.
    c = sd3_components(1400, sd35=False)
    c["text_encoder"] = build(1420, lambda: CLIPTextModelWithProjection(text_config(16, "quick_gelu", 12)))
    c["text_encoder_2"] = build(1430, lambda: CLIPTextModelWithProjection(text_config(24, "gelu", 12)))
    return StableDiffusion3Pipeline(**c)


def flux_components(seed: int, guidance: bool) -> dict:
    return {
        "transformer": with_buffers(build(seed, lambda: FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=guidance,
            axes_dims_rope=(2, 2, 4))), seed + 2),
        "vae": build(seed + 10, lambda: AutoencoderKL(**FLUX_VAE)),
        "text_encoder": build(seed + 20, lambda: CLIPTextModel(text_config(16, "quick_gelu"))),
        "text_encoder_2": build(seed + 30, lambda: T5EncoderModel(t5_config())),
        "tokenizer": AutoTokenizer.from_pretrained(TOKENIZER),
        "tokenizer_2": t5_tokenizer(),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                     max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
    }


def flux():
    return FluxPipeline(**flux_components(1200, guidance=False))


def flux_dev():
    return FluxPipeline(**flux_components(1300, guidance=True))


SKIP_LAYERS = {"skip_guidance_layers": [1], "skip_layer_guidance_scale": 2.8, "skip_layer_guidance_start": 0.0,
               "skip_layer_guidance_stop": 1.0}

# name: (builder, pipeline class, num_inference_steps, call kwargs beyond prompt/latents/size/steps)
CASES = {
    "sd3": (sd3, StableDiffusion3Pipeline, STEPS,
            {"negative_prompt": NEGATIVE, "guidance_scale": 5.0, "max_sequence_length": MAX_SEQUENCE_LENGTH}),
    "sd35": (sd35, StableDiffusion3Pipeline, STEPS,
             {"negative_prompt": NEGATIVE, "guidance_scale": 5.0, "max_sequence_length": MAX_SEQUENCE_LENGTH,
              **SKIP_LAYERS}),
    "flux": (flux, FluxPipeline, STEPS,
             {"negative_prompt": NEGATIVE, "true_cfg_scale": 4.0, "max_sequence_length": MAX_SEQUENCE_LENGTH}),
    "flux-dev": (flux_dev, FluxPipeline, 4,
                 {"guidance_scale": 3.5, "true_cfg_scale": 1.0, "max_sequence_length": MAX_SEQUENCE_LENGTH}),
    "sd3-crop": (sd3_crop, StableDiffusion3Pipeline, STEPS,
                 {"negative_prompt": NEGATIVE, "guidance_scale": 5.0, "max_sequence_length": MAX_SEQUENCE_LENGTH}),
}


def save(pipe, folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    pipe.save_pretrained(folder, safe_serialization=True)
    for name, component in pipe.components.items():
        if not name.startswith("tokenizer") or component is None:
            continue
        kind = type(component).__name__
        source, files = {"CLIPTokenizer": (TOKENIZER, TOKENIZER_FILES),
                         "T5Tokenizer": (T5_TOKENIZER, T5_TOKENIZER_FILES)}[kind]
        shutil.rmtree(folder / name)
        (folder / name).mkdir()
        for f in files:
            shutil.copyfile(source / f, folder / name / f)


class CallRecorder:
    """Forward pre-hook on the transformer: per call, the denoising iteration it belongs to (the
    number of callback_on_step_end calls so far), its batch size and skip_layers."""

    def __init__(self, steps: StepRecorder):
        self.steps, self.calls = steps, []

    def __call__(self, _module, _args, kwargs):
        self.calls.append({"step": len(self.steps.timesteps), "batch": int(kwargs["hidden_states"].shape[0]),
                           "skip_layers": kwargs.get("skip_layers")})


class SetTimestepsRecorder:
    """Wraps scheduler.set_timesteps to keep the arguments the pipeline passed."""

    def __init__(self, scheduler):
        self.scheduler, self.original, self.calls = scheduler, scheduler.set_timesteps, []

    def __enter__(self):
        @functools.wraps(self.original)  # retrieve_timesteps inspects the signature for `sigmas`
        def wrapped(*args, **kwargs):
            sigmas = kwargs.get("sigmas")
            self.calls.append({"num_inference_steps": kwargs.get("num_inference_steps", args[0] if args else None),
                               "sigmas": None if sigmas is None else [float(s) for s in sigmas],
                               "mu": None if kwargs.get("mu") is None else float(kwargs["mu"])})
            return self.original(*args, **kwargs)

        self.scheduler.set_timesteps = wrapped
        return self

    def __exit__(self, *exc):
        del self.scheduler.set_timesteps


def token_ids(tokenizer, text: str, max_length: int) -> list[int]:
    return tokenizer(text, padding="max_length", max_length=max_length, truncation=True).input_ids


def run_pipe(pipe, latents: torch.Tensor, steps_n: int, call: dict, seed: int, size: tuple = (HEIGHT, WIDTH)):
    steps = StepRecorder()
    calls = CallRecorder(steps)
    hook = pipe.transformer.register_forward_pre_hook(calls, with_kwargs=True)
    try:
        with NoiseRecorder(seed) as rec, SetTimestepsRecorder(pipe.scheduler) as st:
            image = pipe(PROMPT, num_inference_steps=steps_n, height=size[0], width=size[1], latents=latents.clone(),
                         output_type="np", callback_on_step_end=steps, **call).images
    finally:
        hook.remove()
    assert not rec.draws, rec.callers
    assert len(st.calls) == 1, st.calls
    return torch.from_numpy(image).to(torch.float32), steps, calls.calls, st.calls[0]


def tester_cases() -> dict:
    """SD3 and Flux as diffusers' own tests build them (`get_dummy_components`, read from
    tester_configs.json): the tests' transformers, VAEs (one block of 4 channels, one group:
    latents the image's size; Flux's a single latent channel) and CLIP encoders, with this
    project's CLIP tokenizer's ids and 16 positions (the tests' tiny-random-clip is on the
    Hub), this project's tiny T5 (the tests load hf-internal-testing/tiny-random-t5 from the
    Hub) and FlowMatchEulerDiscreteScheduler's defaults."""
    data = json.loads((Path(__file__).resolve().parent / "tester_configs.json").read_text())["diffusers"]
    ids = tokenizer_ids()

    def part(key: str, component: str) -> dict:
        return data[key]["components"][component]["kwargs"]

    def clip(key: str, component: str, cls):
        return cls(CLIPTextConfig(**{**part(key, component), **ids}))

    def sd3_tester():
        k = "stable_diffusion_3"
        return StableDiffusion3Pipeline(
            transformer=with_buffers(build(1900, lambda: SD3Transformer2DModel(**part(k, "transformer"))), 1902),
            vae=build(1910, lambda: AutoencoderKL(**part(k, "vae"))),
            text_encoder=build(1920, lambda: clip(k, "text_encoder", CLIPTextModelWithProjection)),
            text_encoder_2=build(1930, lambda: clip(k, "text_encoder_2", CLIPTextModelWithProjection)),
            text_encoder_3=build(1940, lambda: T5EncoderModel(t5_config())),
            tokenizer=AutoTokenizer.from_pretrained(TOKENIZER), tokenizer_2=AutoTokenizer.from_pretrained(TOKENIZER),
            tokenizer_3=t5_tokenizer(), scheduler=FlowMatchEulerDiscreteScheduler())

    def flux_tester():
        k = "flux"
        return FluxPipeline(
            transformer=with_buffers(build(2000, lambda: FluxTransformer2DModel(**part(k, "transformer"))), 2002),
            vae=build(2010, lambda: AutoencoderKL(**part(k, "vae"))),
            text_encoder=build(2020, lambda: clip(k, "text_encoder", CLIPTextModel)),
            text_encoder_2=build(2030, lambda: T5EncoderModel(t5_config())),
            tokenizer=AutoTokenizer.from_pretrained(TOKENIZER), tokenizer_2=t5_tokenizer(),
            scheduler=FlowMatchEulerDiscreteScheduler())

    steps = data["stable_diffusion_3"]["inputs"]["num_inference_steps"]
    sd3_call = {"negative_prompt": NEGATIVE, "guidance_scale": data["stable_diffusion_3"]["inputs"]["guidance_scale"],
                "max_sequence_length": MAX_SEQUENCE_LENGTH}
    flux_steps = data["flux"]["inputs"]["num_inference_steps"]
    flux_call = {"guidance_scale": data["flux"]["inputs"]["guidance_scale"], "max_sequence_length": MAX_SEQUENCE_LENGTH}
    return {
        "tester-sd3": (sd3_tester, StableDiffusion3Pipeline, steps, sd3_call),
        "tester-flux": (flux_tester, FluxPipeline, flux_steps, flux_call),
        # test_skip_guidance_layers' layers [0], stopping at 1.0 rather than the default 0.2,
        # under which none of the test's 2 steps is skipped; test_flux_true_cfg.
        "tester-sd3-skip-guidance-layers": (sd3_tester, StableDiffusion3Pipeline, steps,
                                            {**sd3_call, "skip_guidance_layers": [0],
                                             "skip_layer_guidance_start": 0.01, "skip_layer_guidance_stop": 1.0}),
        "tester-flux-true-cfg": (flux_tester, FluxPipeline, flux_steps,
                                 {**flux_call, "negative_prompt": NEGATIVE, "true_cfg_scale": 2.0}),
        # test_flux_negative_embeds_shape_check's 16 x 16 with true CFG off at 1.0
        # (test_flux_image_output_shape's 32 x 32 is tester-flux's own size; its 72 x 57, which
        # diffusers rounds down to 72 x 56 with a warning, zoo refuses naming the multiple)
        "tester-flux-negative-16x16": (flux_tester, FluxPipeline, flux_steps,
                                       {**flux_call, "negative_prompt": NEGATIVE, "true_cfg_scale": 1.0,
                                        "height": 16, "width": 16}),
    }


def run_case(index: int, name: str, builder, cls, steps_n: int, call: dict, out: Path = OUT) -> dict:
    folder = out / name
    save(builder(), folder)
    pipe = cls.from_pretrained(folder, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    check_eval_f32(pipe)
    is_flux = cls is FluxPipeline
    gen = torch.Generator().manual_seed(5100 + index)
    t: dict[str, torch.Tensor] = {}
    info: dict = {"name": name, "pipeline": cls.__name__}
    cpu = torch.device("cpu")
    tr = pipe.transformer
    # Latent pixels per image pixel (2 for these cases' VAEs, 1 for the tests' one-block ones).
    f = pipe.vae_scale_factor
    clip_len = pipe.tokenizer.model_max_length
    assert clip_len == pipe.text_encoder.config.max_position_embeddings == 16, clip_len

    with torch.no_grad():
        if is_flux:
            seq = (HEIGHT // f // 2) * (WIDTH // f // 2)
            t["transformer.hidden_states"] = torch.randn((1, seq, tr.config.in_channels), generator=gen)
            t["transformer.encoder_hidden_states"] = torch.randn(
                (1, MAX_SEQUENCE_LENGTH, tr.config.joint_attention_dim), generator=gen)
            t["transformer.pooled_projections"] = torch.randn((1, tr.config.pooled_projection_dim), generator=gen)
            t["transformer.timestep"] = torch.tensor([FLUX_TIMESTEP])
            t["transformer.img_ids"] = FluxPipeline._prepare_latent_image_ids(1, HEIGHT // f // 2, WIDTH // f // 2, cpu,
                                                                              torch.float32)
            t["transformer.txt_ids"] = torch.zeros(MAX_SEQUENCE_LENGTH, 3)
            kwargs = {}
            if tr.config.guidance_embeds:
                t["transformer.guidance"] = torch.tensor([call["guidance_scale"]])
                kwargs["guidance"] = t["transformer.guidance"]
            t["transformer.out"] = tr(hidden_states=t["transformer.hidden_states"],
                                      encoder_hidden_states=t["transformer.encoder_hidden_states"],
                                      pooled_projections=t["transformer.pooled_projections"],
                                      timestep=t["transformer.timestep"], img_ids=t["transformer.img_ids"],
                                      txt_ids=t["transformer.txt_ids"], **kwargs).sample
        else:
            t["transformer.hidden_states"] = torch.randn((2, tr.config.in_channels, HEIGHT // f, WIDTH // f),
                                                         generator=gen)
            t["transformer.timestep"] = torch.tensor(SD3_TIMESTEPS)
            t["transformer.encoder_hidden_states"] = torch.randn(
                (2, clip_len + MAX_SEQUENCE_LENGTH, tr.config.joint_attention_dim), generator=gen)
            t["transformer.pooled_projections"] = torch.randn((2, tr.config.pooled_projection_dim), generator=gen)
            inputs = {"hidden_states": t["transformer.hidden_states"], "timestep": t["transformer.timestep"],
                      "encoder_hidden_states": t["transformer.encoder_hidden_states"],
                      "pooled_projections": t["transformer.pooled_projections"]}
            t["transformer.out"] = tr(**inputs).sample
            if tr.config.num_layers > 1:
                t["transformer.out_skip"] = tr(**inputs, skip_layers=[1]).sample
                d = (t["transformer.out"] - t["transformer.out_skip"]).abs().max().item()
                assert d > 100 * TOLERANCES["transformer"], d

        vae = pipe.vae
        t["vae.latents"] = torch.randn((1, vae.config.latent_channels, HEIGHT // f, WIDTH // f), generator=gen)
        t["vae.decoded"] = vae.decode(t["vae.latents"]).sample
        t["vae.image"] = torch.rand((1, 3, HEIGHT, WIDTH), generator=gen) * 2 - 1
        dist = vae.encode(t["vae.image"]).latent_dist
        t["vae.mean"], t["vae.logvar"] = dist.mean, dist.logvar

        info["prompt"] = PROMPT
        negative = call.get("negative_prompt")
        info["negative_prompt"] = negative
        texts = {"prompt": PROMPT, **({"negative_prompt": negative} if negative else {})}
        if is_flux:
            t["prompt_embeds"], t["pooled_prompt_embeds"], t["text_ids"] = pipe.encode_prompt(
                PROMPT, device=cpu, num_images_per_prompt=1, max_sequence_length=MAX_SEQUENCE_LENGTH)
            if negative:
                t["negative_prompt_embeds"], t["negative_pooled_prompt_embeds"], _ = pipe.encode_prompt(
                    negative, device=cpu, num_images_per_prompt=1, max_sequence_length=MAX_SEQUENCE_LENGTH)
            lengths = {"tokenizer": clip_len, "tokenizer_2": MAX_SEQUENCE_LENGTH}
        else:
            (t["prompt_embeds"], t["negative_prompt_embeds"], t["pooled_prompt_embeds"],
             t["negative_pooled_prompt_embeds"]) = pipe.encode_prompt(
                PROMPT, None, None, device=cpu, num_images_per_prompt=1, do_classifier_free_guidance=True,
                negative_prompt=negative, max_sequence_length=MAX_SEQUENCE_LENGTH)
            lengths = {"tokenizer": clip_len, "tokenizer_2": clip_len, "tokenizer_3": MAX_SEQUENCE_LENGTH}
            # CLIP channels (8 + 16) are zero-padded up to T5's 32; sd3-crop's 16 + 24 cropped.
            clip_dim = pipe.text_encoder.config.hidden_size + pipe.text_encoder_2.config.hidden_size
            if name in CASES:
                assert (clip_dim < tr.config.joint_attention_dim) == (name != "sd3-crop")
            assert not t["prompt_embeds"][:, :clip_len, clip_dim:].any()
        info["token_ids"] = {
            name_: {"class": type(getattr(pipe, name_)).__name__, "max_length": n,
                    **{k: token_ids(getattr(pipe, name_), v, n) for k, v in texts.items()}}
            for name_, n in lengths.items()}

        # A variant's own size (the call's), else the cases' common one.
        ph, pw = call.get("height", HEIGHT), call.get("width", WIDTH)
        if is_flux:
            # Flux rounds a size down to whole 2 x 2 patches of latents (prepare_latents).
            lh, lw = 2 * (ph // (f * 2)), 2 * (pw // (f * 2))
            unpacked = torch.randn((1, pipe.transformer.config.in_channels // 4, lh, lw), generator=gen)
            t["pipe.latents_unpacked"] = unpacked
            t["pipe.latents"] = FluxPipeline._pack_latents(unpacked, 1, unpacked.shape[1], lh, lw)
            assert torch.equal(FluxPipeline._unpack_latents(t["pipe.latents"], lh * f, lw * f, pipe.vae_scale_factor),
                               unpacked)
        else:
            t["pipe.latents"] = torch.randn((1, tr.config.in_channels, ph // f, pw // f), generator=gen)
        sized = {k: v for k, v in call.items() if k not in ("height", "width")}
        t["pipe.image"], steps, calls, set_ts = run_pipe(pipe, t["pipe.latents"], steps_n, sized, 6100 + index,
                                                         (ph, pw))
        t["timesteps"] = torch.tensor(steps.timesteps, dtype=torch.float32)
        t["sigmas"] = pipe.scheduler.sigmas.to(torch.float32)
        assert len(steps.timesteps) == steps_n

        info["num_inference_steps"] = steps_n
        info["call"] = {"prompt": PROMPT, "height": ph, "width": pw, "num_inference_steps": steps_n,
                        "latents": "pipe.latents", "output_type": "np", **sized}
        info["height"], info["width"] = ph, pw
        info["max_sequence_length"] = MAX_SEQUENCE_LENGTH
        info["set_timesteps"] = set_ts
        info["transformer_calls"] = calls
        info["timesteps"] = "one entry per denoising iteration, from callback_on_step_end"
        if is_flux:
            info["mu"] = set_ts["mu"]
            info["sigmas_passed"] = set_ts["sigmas"]
            image_seq_len = t["pipe.latents"].shape[1]
            sc = pipe.scheduler.config
            m = (sc.max_shift - sc.base_shift) / (sc.max_image_seq_len - sc.base_image_seq_len)
            assert abs(set_ts["mu"] - (image_seq_len * m + sc.base_shift - m * sc.base_image_seq_len)) < 1e-12
            expected_calls = 2 if call.get("true_cfg_scale", 1.0) > 1 and negative else 1
            assert len(calls) == expected_calls * steps_n and all(c["batch"] == 1 for c in calls), calls
        else:
            assert set_ts["mu"] is None and set_ts["sigmas"] is None, set_ts
            slg = [c["step"] for c in calls if c["skip_layers"] is not None]
            if "skip_guidance_layers" in call:
                info["skip_layer_guidance_steps"] = slg
                expected = [i for i in range(steps_n) if steps_n * call["skip_layer_guidance_start"] < i
                            < steps_n * call["skip_layer_guidance_stop"]]
                assert slg == expected and slg, (slg, expected)
                assert all(c["batch"] == 1 for c in calls if c["skip_layers"] is not None)
            else:
                assert not slg
            assert sum(c["batch"] == 2 for c in calls) == steps_n

        if name == "sd3":
            no_t5 = StableDiffusion3Pipeline(**{**pipe.components, "text_encoder_3": None, "tokenizer_3": None})
            no_t5.set_progress_bar_config(disable=True)
            t["no_t5.prompt_embeds"] = no_t5.encode_prompt(
                PROMPT, None, None, device=cpu, num_images_per_prompt=1, do_classifier_free_guidance=False,
                max_sequence_length=MAX_SEQUENCE_LENGTH)[0]
            assert not t["no_t5.prompt_embeds"][:, clip_len:].any()
            assert torch.equal(t["no_t5.prompt_embeds"][:, :clip_len], t["prompt_embeds"][:, :clip_len])
            t["no_t5.image"], no_t5_steps, _, _ = run_pipe(no_t5, t["pipe.latents"], steps_n, call, 7100 + index)
            assert no_t5_steps.timesteps == steps.timesteps
            d = (t["no_t5.image"] - t["pipe.image"]).abs().max().item()
            assert d > 10 * TOLERANCES["image"], d
            info["no_t5"] = ("StableDiffusion3Pipeline(**components, text_encoder_3=None, tokenizer_3=None), the "
                             "same call and latents: _get_t5_prompt_embeds returns zeros [batch, max_sequence_length, "
                             "joint_attention_dim] (for the negative prompt too)")

        info["notes"] = notes(name, pipe, is_flux)

    info["buffers_perturbed"] = {"transformer": persistent_buffers(pipe.transformer)}
    info["tensors"] = {k: {"shape": list(v.shape), "what": describe(k, is_flux)} for k, v in sorted(t.items())}
    info["tolerances"] = TOLERANCES
    info["library_versions"] = {p: importlib.metadata.version(p)
                                for p in ("torch", "transformers", "tokenizers", "diffusers", "safetensors")}
    info["command"] = COMMAND
    for k, v in t.items():
        assert torch.isfinite(v).all(), k
    save_file({k: v.contiguous().to(torch.float32) for k, v in sorted(t.items())}, folder / "expected.safetensors")
    (folder / "case.json").write_text(json.dumps(info, indent=1) + "\n")

    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"{name}: {size / 1e6:.2f} MB, transformer.out std {t['transformer.out'].std():.4f}, "
          f"image std {t['pipe.image'].std():.4f} min {t['pipe.image'].min():.3f} max {t['pipe.image'].max():.3f}, "
          f"timesteps {[round(x, 3) for x in t['timesteps'].tolist()]}, sigmas "
          f"{[round(x, 4) for x in t['sigmas'].tolist()]}")
    print(f"  vae.decoded std {t['vae.decoded'].std():.4f}, vae.mean std {t['vae.mean'].std():.4f}, "
          f"logvar mean {t['vae.logvar'].mean():.4f}, prompt_embeds std {t['prompt_embeds'].std():.4f}, "
          f"pooled std {t['pooled_prompt_embeds'].std():.4f}, set_timesteps {set_ts}")
    for k, v in sorted(t.items()):
        print(f"    {k} {list(v.shape)} " + (f"std {v.std():.4f}" if v.numel() > 1 else f"= {v.item()}"))
    return {"name": name, "bytes": size}


def describe(key: str, is_flux: bool) -> str:
    if key.startswith("transformer."):
        part = key.split(".", 1)[1]
        if part == "out":
            return "the transformer alone on the transformer.* inputs (.sample)"
        if part == "out_skip":
            return "the same inputs with skip_layers=[1] (block 1 not run)"
        return {"timestep": "0..1 scale (times 1000 inside)" if is_flux else "0..1000 scale, as the pipeline passes t",
                "img_ids": "FluxPipeline._prepare_latent_image_ids: (0, row, col) of the 8x8 packed grid",
                "txt_ids": "zeros, as encode_prompt builds text_ids",
                "guidance": "guidance_scale (times 1000 inside)",
                "hidden_states": "packed latents" if is_flux else "latents",
                }.get(part, "transformer input")
    return {
        "vae.latents": "vae.decode input (no scaling or shift)",
        "vae.decoded": "vae.decode(vae.latents).sample",
        "vae.image": "vae.encode input in [-1, 1]",
        "vae.mean": "vae.encode(vae.image).latent_dist.mean",
        "vae.logvar": "vae.encode(vae.image).latent_dist.logvar (clamped to [-30, 20])",
        "prompt_embeds": "encode_prompt(prompt)",
        "negative_prompt_embeds": "encode_prompt's negative prompt embeddings",
        "pooled_prompt_embeds": "encode_prompt(prompt), pooled",
        "negative_pooled_prompt_embeds": "encode_prompt's negative pooled embeddings",
        "text_ids": "encode_prompt's text_ids",
        "pipe.latents": "latents= of the pipeline call" + (" (packed)" if is_flux else ""),
        "pipe.latents_unpacked": "pipe.latents before FluxPipeline._pack_latents",
        "pipe.image": "the pipeline's output_type='np' image (NHWC, [0, 1])",
        "timesteps": "the timestep of each denoising iteration (callback_on_step_end)",
        "sigmas": "scheduler.sigmas after the run (terminal 0 appended)",
        "no_t5.prompt_embeds": "encode_prompt(prompt) without text_encoder_3: T5 positions are zeros",
        "no_t5.image": "the same call and latents with text_encoder_3 = tokenizer_3 = None",
    }[key]


def notes(name: str, pipe, is_flux: bool) -> list[str]:
    if is_flux:
        out = [
            "prompt_embeds = T5 last_hidden_state (no attention mask, max_sequence_length positions); "
            "pooled_prompt_embeds = CLIPTextModel pooler_output (final_layer_norm, at the first eos); "
            "text_ids = zeros [max_sequence_length, 3]",
            "latents are packed: [B, C, H, W] -> view [B, C, H/2, 2, W/2, 2] -> permute (0, 2, 4, 1, 3, 5) -> "
            "[B, H/2 * W/2, C * 4]; _unpack_latents inverts it before the VAE",
            "img_ids [H/2 * W/2, 3] = (0, row, col) of the packed grid; rope ids = cat(txt_ids, img_ids), "
            "axes_dims_rope (2, 2, 4) over the 3 id columns, frequencies computed in float64",
            "the transformer gets timestep = t / 1000 (t cast to the latents' dtype first) and multiplies it by "
            "1000 inside (guidance too), so the time embedding sees float32(float32(t / 1000) * 1000)",
            "scheduler: FluxPipeline passes sigmas = np.linspace(1.0, 1 / steps, steps) and mu = calculate_shift("
            "image_seq_len = packed tokens, base_image_seq_len, max_image_seq_len, base_shift, max_shift) = "
            "image_seq_len * m + (base_shift - m * base_image_seq_len), m = (max_shift - base_shift) / "
            "(max_image_seq_len - base_image_seq_len); set_timesteps shifts them exponentially: "
            "exp(mu) / (exp(mu) + (1 / sigma - 1)); timesteps = sigmas * 1000; set_begin_index(0)",
            "decode: latents / scaling_factor + shift_factor",
        ]
        if name == "flux":
            out.append("true CFG (true_cfg_scale > 1 and a negative prompt): two batch-1 transformer calls per "
                       "step, the negative one with its own prompt_embeds, pooled and text_ids; noise_pred = neg + "
                       "true_cfg_scale * (pos - neg)")
        else:
            out.append("guidance_embeds: guidance = full([1], guidance_scale) expanded to the batch, embedded "
                       "(times 1000, sinusoidal 256, MLP) and added to the timestep and pooled embeddings; one "
                       "transformer call per step (true_cfg_scale 1.0, no negative prompt)")
        return out
    out = [
        "prompt_embeds = cat(pad(cat(clip_1, clip_2, dim=-1), to joint_attention_dim with zeros on the last dim), "
        "t5, dim=-2): clip_i = hidden_states[-2] of each CLIPTextModelWithProjection (penultimate layer, no "
        "final_layer_norm), [B, 16, 8 + 16 = 24] padded to 32; t5 = T5 last_hidden_state (no attention mask) "
        "[B, 16, 32]; so [B, 32, 32]",
        "pooled_prompt_embeds = cat(text_embeds of text_encoder, text_embeds of text_encoder_2) (the projected "
        "pooled outputs, 12 + 12 = 24)",
        "CFG batch = cat(negative, positive); noise_pred = uncond + guidance_scale * (text - uncond); timestep "
        "passed as is (scheduler.timesteps, 0..1000)",
        "pos_embed: the stored (perturbed) pos_embed_max_size^2 table is cropped at the centre to the patch grid: "
        "top = (12 - 8) // 2, left = (12 - 8) // 2",
        "scheduler: FlowMatchEulerDiscreteScheduler(shift=3.0), no dynamic shifting: timesteps = linspace("
        "sigma_max * 1000, sigma_min * 1000, steps) where sigma_max, sigma_min are the first and last of the "
        "training sigmas that __init__ already shifted (sigma_min = shift * 0.001 / (1 + (shift - 1) * 0.001)), "
        "then sigmas = timesteps / 1000 are shifted again: shift * s / (1 + (shift - 1) * s), so the last sigma "
        "is shifted twice; timesteps = sigmas * 1000, sigmas get a terminal 0; step: sample + (sigma_next - "
        "sigma) * model_output in float32; the step index comes from index_for_timestep (SD3 does not "
        "set_begin_index)",
        "decode: latents / scaling_factor + shift_factor",
    ]
    if name == "sd35":
        out.append("skip-layer guidance: for iterations i with steps * start < i < steps * stop (strict, so i = 0 "
                   "never runs it), one more batch-1 call on the positive embeddings only with skip_layers; "
                   "noise_pred = uncond + g * (text - uncond) + (text - skip) * skip_layer_guidance_scale")
    return out


def main() -> None:
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    diffusers.utils.logging.disable_progress_bar()
    args = sys.argv[1:]
    # `--tester DIR` writes the pipelines of diffusers' own tests (tester_cases) into DIR.
    if args[:1] == ["--tester"]:
        if len(args) != 2:
            raise SystemExit("usage: flow_pipelines.py --tester DIR")
        out, cases, only, base = Path(args[1]), tester_cases(), set(), 100
    else:
        out, cases, only, base = OUT, CASES, set(args), 0
    out.mkdir(parents=True, exist_ok=True)
    # Case names as arguments write those cases only (the others' files are left alone).
    unknown = only - set(cases)
    if unknown:
        raise SystemExit(f"no such case: {', '.join(sorted(unknown))} (cases: {', '.join(cases)})")
    total, written = 0, 0
    for i, (name, (builder, cls, steps_n, call)) in enumerate(cases.items()):
        if only and name not in only:
            continue
        total += run_case(base + i, name, builder, cls, steps_n, call, out)["bytes"]
        written += 1
    print(f"wrote {written} cases to {out} ({total / 1e6:.2f} MB), diffusers {diffusers.__version__}")


if __name__ == "__main__":
    main()
