"""Writes diffusers/tests/data/schedulers/: one folder per case with the scheduler's
scheduler_config.json (as diffusers' save_config writes it) and trace.safetensors, what
diffusers computes for it: the inference timesteps, sigmas and init_noise_sigma, then a
10-step trace on fixed model outputs — each step's scaled model input and resulting sample.

Flow-matching cases (FlowMatchEulerDiscreteScheduler, `flowmatch-*`) also get `timesteps.json`
when their `set_timesteps` takes more than the step count: the keyword arguments a flow
pipeline passes (`mu` under dynamic shifting, custom `sigmas` as FluxPipeline builds them:
np.linspace(1.0, 1 / 10, 10)), written as passed. That class has neither `init_noise_sigma`
nor `scale_model_input`: init_noise_sigma is stored as 1.0 (flow pipelines use the latents
as drawn) and each model input is the sample itself. Its `step` takes the float timesteps of
`scheduler.timesteps`; `sigmas` (scheduler.sigmas, the terminal 0 — or 1 with invert_sigmas —
appended) is stored for these cases too. `flowmatch-stochastic` draws its noise (x0 mixed
with fresh noise at the next sigma) through the module's `randn_tensor`, which the feed
below replaces.

Steps that add noise (DDPM, Euler ancestral, DDIM with eta > 0) get theirs from the case
(`noise`, one tensor per step): diffusers' `randn_tensor` is replaced by a reader of it while
the trace runs, so a port that takes the noise as an input reproduces diffusers exactly.

Run: .venv/bin/python nightly/reference/schedulers.py
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers

OUT = Path(__file__).resolve().parents[2] / "diffusers/tests/data/schedulers"
STEPS = 10
SHAPE = (2, 4, 4, 4)

SD = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012, "steps_offset": 1}

# name: (class, config overrides, step kwargs, model-output channels factor)
CASES: dict[str, tuple[str, dict, dict, int]] = {
    "ddim-sd15": ("DDIMScheduler", {**SD, "clip_sample": False, "set_alpha_to_one": False}, {}, 1),
    "ddim-vpred-trailing-zero-snr": ("DDIMScheduler", {**SD, "prediction_type": "v_prediction",
                                                       "timestep_spacing": "trailing", "rescale_betas_zero_snr": True,
                                                       "clip_sample": False}, {}, 1),
    "ddim-eta-linear-clip": ("DDIMScheduler", {"clip_sample": True, "clip_sample_range": 0.5}, {"eta": 1.0}, 1),
    "ddim-thresholding-cosine": ("DDIMScheduler", {"beta_schedule": "squaredcos_cap_v2", "thresholding": True,
                                                   "sample_max_value": 1.5, "prediction_type": "sample",
                                                   "timestep_spacing": "linspace"}, {}, 1),
    "ddpm-default": ("DDPMScheduler", {}, {}, 1),
    "ddpm-learned-range-cosine": ("DDPMScheduler", {"beta_schedule": "squaredcos_cap_v2",
                                                    "variance_type": "learned_range", "timestep_spacing": "trailing"},
                                  {}, 2),
    "ddpm-vpred-sigmoid-fixed-large": ("DDPMScheduler", {"beta_schedule": "sigmoid", "prediction_type": "v_prediction",
                                                         "variance_type": "fixed_large", "clip_sample": False}, {}, 1),
    "euler-sd15": ("EulerDiscreteScheduler", {**SD, "timestep_spacing": "leading"}, {}, 1),
    "euler-karras": ("EulerDiscreteScheduler", {**SD, "use_karras_sigmas": True}, {}, 1),
    "euler-exponential-vpred-continuous": ("EulerDiscreteScheduler", {**SD, "use_exponential_sigmas": True,
                                                                      "prediction_type": "v_prediction",
                                                                      "timestep_type": "continuous",
                                                                      "final_sigmas_type": "sigma_min"}, {}, 1),
    "euler-loglinear-trailing-sample": ("EulerDiscreteScheduler", {"interpolation_type": "log_linear",
                                                                   "timestep_spacing": "trailing",
                                                                   "prediction_type": "sample"}, {}, 1),
    "euler-ancestral-sd15": ("EulerAncestralDiscreteScheduler", {**SD, "timestep_spacing": "leading"}, {}, 1),
    "euler-ancestral-vpred-zero-snr": ("EulerAncestralDiscreteScheduler", {**SD, "prediction_type": "v_prediction",
                                                                           "timestep_spacing": "trailing",
                                                                           "rescale_betas_zero_snr": True}, {}, 1),
    "pndm-sd15-skip-prk": ("PNDMScheduler", {**SD, "skip_prk_steps": True}, {}, 1),
    "pndm-prk-vpred-linspace": ("PNDMScheduler", {"prediction_type": "v_prediction", "timestep_spacing": "linspace",
                                                  "set_alpha_to_one": True}, {}, 1),
    "pndm-prk-trailing": ("PNDMScheduler", {**SD, "timestep_spacing": "trailing"}, {}, 1),
    "lms-sd15": ("LMSDiscreteScheduler", {**SD, "timestep_spacing": "leading"}, {}, 1),
    "lms-karras-vpred": ("LMSDiscreteScheduler", {**SD, "use_karras_sigmas": True, "prediction_type": "v_prediction"},
                         {}, 1),
    "unipc-sd15": ("UniPCMultistepScheduler", {**SD, "timestep_spacing": "leading"}, {}, 1),
    "unipc-bh1-order3-vpred-trailing": ("UniPCMultistepScheduler", {**SD, "solver_order": 3, "solver_type": "bh1",
                                                                    "prediction_type": "v_prediction",
                                                                    "timestep_spacing": "trailing"}, {}, 1),
    "unipc-karras-noise-pred": ("UniPCMultistepScheduler", {**SD, "predict_x0": False, "use_karras_sigmas": True,
                                                            "final_sigmas_type": "sigma_min",
                                                            "disable_corrector": [0]}, {}, 1),
    "unipc-flow-shift3-terminal": ("UniPCMultistepScheduler", {"use_flow_sigmas": True, "flow_shift": 3.0,
                                                               "prediction_type": "flow_prediction",
                                                               "shift_terminal": 0.1}, {}, 1),
    "unipc-exponential-order3": ("UniPCMultistepScheduler", {**SD, "use_exponential_sigmas": True,
                                                             "solver_order": 3, "final_sigmas_type": "sigma_min",
                                                             "lower_order_final": False}, {}, 1),
    "dpmpp-2m-sd15": ("DPMSolverMultistepScheduler", {**SD, "timestep_spacing": "leading"}, {}, 1),
    "dpmpp-2m-karras": ("DPMSolverMultistepScheduler", {**SD, "use_karras_sigmas": True}, {}, 1),
    "dpmpp-3m-heun-vpred-trailing": ("DPMSolverMultistepScheduler", {**SD, "solver_order": 3, "solver_type": "heun",
                                                                     "prediction_type": "v_prediction",
                                                                     "timestep_spacing": "trailing",
                                                                     "lower_order_final": False}, {}, 1),
    "dpmpp-sde-2m-exponential": ("DPMSolverMultistepScheduler", {**SD, "algorithm_type": "sde-dpmsolver++",
                                                                 "use_exponential_sigmas": True}, {}, 1),
    "dpmsolver-sample-cosine-clipped": ("DPMSolverMultistepScheduler", {"beta_schedule": "squaredcos_cap_v2",
                                                                        "algorithm_type": "dpmsolver",
                                                                        "prediction_type": "sample",
                                                                        "final_sigmas_type": "sigma_min",
                                                                        "lambda_min_clipped": -5.1,
                                                                        "thresholding": True,
                                                                        "sample_max_value": 1.5}, {}, 1),
    "dpmpp-lu-lambdas-euler-final": ("DPMSolverMultistepScheduler", {**SD, "use_lu_lambdas": True,
                                                                     "euler_at_final": True}, {}, 1),
    "dpmpp-flow-shift3": ("DPMSolverMultistepScheduler", {"use_flow_sigmas": True, "flow_shift": 3.0,
                                                          "prediction_type": "flow_prediction"}, {}, 1),
    # Flow matching (SD3, Flux): appended so the seeds (4200 + index) of the cases above stay.
    "flowmatch-sd3-shift3": ("FlowMatchEulerDiscreteScheduler", {"shift": 3.0}, {}, 1),
    "flowmatch-flux-dynamic": ("FlowMatchEulerDiscreteScheduler", {"use_dynamic_shifting": True}, {}, 1),
    "flowmatch-linear-terminal": ("FlowMatchEulerDiscreteScheduler", {"use_dynamic_shifting": True,
                                                                             "time_shift_type": "linear",
                                                                             "shift_terminal": 0.1}, {}, 1),
    "flowmatch-invert": ("FlowMatchEulerDiscreteScheduler", {"invert_sigmas": True, "shift": 2.0}, {}, 1),
    "flowmatch-karras": ("FlowMatchEulerDiscreteScheduler", {"use_karras_sigmas": True, "shift": 3.0}, {}, 1),
    "flowmatch-exponential": ("FlowMatchEulerDiscreteScheduler", {"use_exponential_sigmas": True}, {}, 1),
    "flowmatch-stochastic": ("FlowMatchEulerDiscreteScheduler", {"stochastic_sampling": True, "shift": 3.0}, {}, 1),
    "flowmatch-custom-sigmas": ("FlowMatchEulerDiscreteScheduler", {"use_dynamic_shifting": True}, {}, 1),
}

# name: keyword arguments of set_timesteps beyond the step count (written to timesteps.json)
SET_TIMESTEPS: dict[str, dict] = {
    "flowmatch-flux-dynamic": {"mu": 0.93},
    "flowmatch-linear-terminal": {"mu": 1.3},
    # as FluxPipeline passes them: np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
    "flowmatch-custom-sigmas": {"sigmas": [float(s) for s in np.linspace(1.0, 1 / STEPS, STEPS)], "mu": 1.1},
}


class NoiseFeed:
    """Replaces `randn_tensor` in a scheduler module with the next recorded noise tensor."""

    def __init__(self, module, noise: torch.Tensor):
        self.module, self.noise, self.used = module, noise, 0

    def __enter__(self):
        self.original = getattr(self.module, "randn_tensor", None)

        def feed(shape, **_kwargs):
            t = self.noise[self.step]
            assert tuple(t.shape) == tuple(shape), (t.shape, shape)
            self.used += 1
            return t.clone()

        self.module.randn_tensor = feed
        return self

    def __exit__(self, *exc):
        if self.original is None:
            del self.module.randn_tensor
        else:
            self.module.randn_tensor = self.original


def trace(name: str, cls_name: str, overrides: dict, step_kwargs: dict, factor: int, seed: int) -> None:
    cls = getattr(diffusers, cls_name)
    scheduler = cls(**overrides)
    folder = OUT / name
    if folder.exists():
        shutil.rmtree(folder)
    scheduler.save_config(folder)
    scheduler = cls.from_config(cls.load_config(folder))
    timestep_kwargs = SET_TIMESTEPS.get(name, {})
    scheduler.set_timesteps(STEPS, **timestep_kwargs)
    gen = torch.Generator().manual_seed(seed)
    n = len(scheduler.timesteps)
    sample = torch.randn(SHAPE, generator=gen)
    out_shape = (SHAPE[0], SHAPE[1] * factor, *SHAPE[2:])
    outputs = torch.randn((n, *out_shape), generator=gen)
    if factor == 2:  # a learned variance in [-1, 1]
        outputs[:, :, SHAPE[1]:] = outputs[:, :, SHAPE[1]:].tanh()
    noise = torch.randn((n, *SHAPE), generator=gen)
    module = importlib.import_module(cls.__module__)
    # FlowMatchEulerDiscreteScheduler has no init_noise_sigma and no scale_model_input.
    init_noise_sigma = getattr(scheduler, "init_noise_sigma", 1.0)
    scale = getattr(scheduler, "scale_model_input", lambda s, _t: s)
    x = sample * init_noise_sigma
    inputs, samples = [], []
    with NoiseFeed(module, noise) as feed:
        for i, t in enumerate(scheduler.timesteps):
            inputs.append(scale(x, t))
            feed.step = i
            kwargs = dict(step_kwargs)
            if cls_name == "DDIMScheduler" and kwargs.get("eta", 0) > 0:
                kwargs["variance_noise"] = noise[i]
            x = scheduler.step(outputs[i], t, x, **kwargs).prev_sample
            samples.append(x)
    if overrides.get("stochastic_sampling"):
        assert feed.used == n, (name, feed.used)
    tensors = {
        "sample": sample,
        "model_outputs": outputs,
        "noise": noise,
        "timesteps": scheduler.timesteps.to(torch.float64),
        "init_noise_sigma": torch.tensor([float(init_noise_sigma)], dtype=torch.float64),
        "model_inputs": torch.stack(inputs),
        "samples": torch.stack(samples),
    }
    if cls_name.startswith(("Euler", "DPMSolver", "LMS", "UniPC", "FlowMatch")):
        tensors["sigmas"] = scheduler.sigmas.to(torch.float32)
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "trace.safetensors")
    (folder / "step.json").write_text(json.dumps(step_kwargs) + "\n")
    if timestep_kwargs:
        (folder / "timesteps.json").write_text(json.dumps(timestep_kwargs) + "\n")


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    for i, (name, (cls_name, overrides, kwargs, factor)) in enumerate(CASES.items()):
        trace(name, cls_name, overrides, kwargs, factor, 4200 + i)
        print("wrote", OUT / name)
    versions = {p: importlib.metadata.version(p) for p in ("diffusers", "torch")}
    (OUT / "README.json").write_text(json.dumps({
        "command": ".venv/bin/python nightly/reference/schedulers.py",
        "steps": STEPS,
        "library_versions": versions,
        "cases": list(CASES),
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
