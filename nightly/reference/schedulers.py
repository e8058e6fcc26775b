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
import re
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


def dummy_sample_deter() -> torch.Tensor:
    """diffusers' SchedulerCommonTest.dummy_sample_deter: arange(768) / 768 as (3, 8, 8, 4),
    permuted to (4, 3, 8, 8)."""
    return (torch.arange(4 * 3 * 8 * 8, dtype=torch.float32) / (4 * 3 * 8 * 8)).reshape(3, 8, 8, 4).permute(3, 0, 1, 2)


def trace(name: str, cls_name: str, overrides: dict, step_kwargs: dict, factor: int, seed: int,
          out: Path = OUT, steps: int = STEPS, shape: tuple = SHAPE, dummy_model: bool = False,
          timestep_kwargs: dict | None = None) -> None:
    """Writes case `name` into `out`. With `dummy_model`, the sample is the scheduler tests'
    dummy_sample_deter and each model output is their dummy model's, `input * t / (t + 1)`
    (recorded as the case's model outputs); else both are random."""
    cls = getattr(diffusers, cls_name)
    scheduler = cls(**overrides)
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    scheduler.save_config(folder)
    scheduler = cls.from_config(cls.load_config(folder))
    if timestep_kwargs is None:
        timestep_kwargs = SET_TIMESTEPS.get(name, {})
    if "timesteps" in timestep_kwargs or ("sigmas" in timestep_kwargs and cls_name != "FlowMatchEulerDiscreteScheduler"):
        # A custom schedule sets the step count itself (diffusers refuses both).
        scheduler.set_timesteps(**timestep_kwargs)
    else:
        scheduler.set_timesteps(steps, **timestep_kwargs)
    if dummy_model or out != OUT:
        # Step i is index i, as zoo's `step` takes it: diffusers finds the first index from the
        # timestep's value, which with repeated timesteps (Karras sigmas over an unusual
        # range) starts at the second and runs off the end.
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
    gen = torch.Generator().manual_seed(seed)
    n = len(scheduler.timesteps)
    sample = dummy_sample_deter() if dummy_model else torch.randn(shape, generator=gen)
    shape = tuple(sample.shape)
    out_shape = (shape[0], shape[1] * factor, *shape[2:])
    outputs = torch.randn((n, *out_shape), generator=gen)
    if factor == 2:  # a learned variance in [-1, 1]
        outputs[:, :, shape[1]:] = outputs[:, :, shape[1]:].tanh()
    noise = torch.randn((n, *shape), generator=gen)
    module = importlib.import_module(cls.__module__)
    # FlowMatchEulerDiscreteScheduler has no init_noise_sigma and no scale_model_input.
    init_noise_sigma = getattr(scheduler, "init_noise_sigma", 1.0)
    scale = getattr(scheduler, "scale_model_input", lambda s, _t: s)
    x = sample * init_noise_sigma
    inputs, samples = [], []
    with NoiseFeed(module, noise) as feed:
        for i, t in enumerate(scheduler.timesteps):
            inputs.append(scale(x, t))
            if dummy_model:
                outputs[i] = inputs[-1] * t / (t + 1)
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
    written = {**timestep_kwargs, **({"num_inference_steps": steps} if steps != STEPS else {})}
    if written:
        (folder / "timesteps.json").write_text(json.dumps(written) + "\n")


# The scheduler tests' sample shape (SchedulerCommonTest.dummy_sample: 4 x 3 x 8 x 8).
TESTER_SHAPE = (4, 3, 8, 8)
TESTER_CONFIGS = json.loads((Path(__file__).resolve().parent / "tester_configs.json").read_text())["schedulers"]
SHORT = {"DDIMScheduler": "ddim", "DDPMScheduler": "ddpm", "EulerDiscreteScheduler": "euler",
         "EulerAncestralDiscreteScheduler": "euler-ancestral", "DPMSolverMultistepScheduler": "dpmsolver",
         "PNDMScheduler": "pndm", "LMSDiscreteScheduler": "lms", "FlowMatchEulerDiscreteScheduler": "flowmatch"}
# Variants of a test's loop that are not scheduler configs: a step at chosen timesteps (every
# case steps through all of them) and the custom-timestep and custom-sigma loops (listed as
# not covered: zoo's set_timesteps takes custom sigmas for flow matching only).
NOT_CONFIG = {"time_step", "t_and_num_inference_steps", "t_and_eta"}
# Configs zoo refuses on purpose: (class, field, value) -> why. Their cases carry
# `refused.json`; the test checks that zoo refuses them naming the value.
REFUSED = {("DDPMScheduler", "variance_type", "other"):
           "diffusers runs any variance_type it does not name as fixed_small; zoo refuses a name it does not know "
           "(a misspelt one would otherwise run silently)"}
NOT_COVERED: dict[str, str] = {}
# The custom-schedule loops: each config's full loop with set_timesteps(timesteps=...) or
# (sigmas=...) given the schedule its own set_timesteps(10) makes, as the tests do.
CUSTOM = {"custom_timesteps_loop": "timesteps", "custom_sigmas_loop": "sigmas"}


def _product(group: dict) -> list[dict]:
    """Every combination of a grouped variant's list-valued fields (its scalars fixed)."""
    combos = [{}]
    for key, value in group.items():
        values = value if isinstance(value, list) else [value]
        combos = [{**c, key: v} for c in combos for v in values]
    return combos


def _field(key: str, value) -> dict:
    """A variant value as config fields (and `steps`, the inference step count)."""
    if key == "beta_start_end_pairs":
        return {"beta_start": value[0], "beta_end": value[1]}
    if key in ("num_inference_steps", "pow_of_3_inference_steps"):
        return {"steps": value}
    if key == "lambda_min_clipped" and value == "-inf":
        return {key: float("-inf")}
    return {key: value}


def tester_cases() -> tuple[dict[str, dict], dict[str, str]]:
    """Case name -> (class, config, steps, dummy model, set_timesteps kwargs), one per distinct
    config that diffusers' scheduler tests build (their `get_scheduler_config` under each
    variant value their check_over_configs / check_over_forward loops set, and every
    combination of a grouped loop), plus each test class's full loop on its dummy model; and
    the loops not covered, with the reason."""
    cases: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    seen: set[str] = set()

    def add(cls_name: str, label: str, fields: dict, dummy: bool = False, mu: float | None = None,
            custom: str | None = None) -> None:
        base = dict(TESTER_CONFIGS[cls_name]["config"])
        if base.get("lambda_min_clipped", 0) != 0 and isinstance(base["lambda_min_clipped"], str):
            base["lambda_min_clipped"] = float("-inf")
        fields = dict(fields)
        steps = fields.pop("steps", STEPS)
        config = {**base, **fields}
        # As the tests step them: never more inference steps than training steps.
        steps = min(steps, config.get("num_train_timesteps", 1000))
        # One case per distinct config as the class resolves it (a variant value that is
        # the default is the base config again).
        scheduler = getattr(diffusers, cls_name)(**config)
        resolved = {k: v for k, v in scheduler.config.items() if not k.startswith("_")}
        key = json.dumps([cls_name, resolved, steps, dummy, mu, custom], sort_keys=True, default=str)
        if key in seen:
            return
        seen.add(key)
        name = re.sub(r"-+", "-", re.sub(r"[^A-Za-z0-9]+", "-", f"tester-{SHORT[cls_name]}-{label}".replace(".", "p").replace("++", "pp")))
        name = name.strip("-").lower()
        assert name not in cases, f"two configs named {name}"
        timesteps: dict = {} if mu is None else {"mu": mu}
        if custom:
            scheduler.set_timesteps(steps)
            schedule = scheduler.timesteps if custom == "timesteps" else scheduler.sigmas
            timesteps[custom] = [float(v) for v in schedule]
        refused = next(({"field": f, "value": v, "why": why} for (c, f, v), why in REFUSED.items()
                        if c == cls_name and config.get(f) == v), None)
        cases[name] = {"class": cls_name, "config": config, "steps": steps, "dummy": dummy, "timesteps": timesteps,
                       "refused": refused}

    for cls_name, tester in TESTER_CONFIGS.items():
        if cls_name == "FlowMatchEulerDiscreteScheduler":
            continue
        add(cls_name, "base", {})
        add(cls_name, "full-loop", {}, dummy=True)
        for key, value in tester["variants"].items():
            if key in NOT_CONFIG:
                continue
            if key in NOT_COVERED:
                skipped[f"{SHORT[cls_name]}: {key}"] = f"{NOT_COVERED[key]} ({len(_product(value))} configs)"
                continue
            if key in CUSTOM:
                for combo in _product(value):
                    label = "-".join([f"custom-{CUSTOM[key]}", *(f"{k}-{v}" for k, v in combo.items())])
                    add(cls_name, label, combo, dummy=True, custom=CUSTOM[key])
                continue
            if isinstance(value, dict):
                for combo in _product(value):
                    # test_solver_order_and_type skips the SDE forms at order 3 (diffusers has
                    # no third-order SDE update).
                    if str(combo.get("algorithm_type", "")).startswith("sde") and combo.get("solver_order") == 3:
                        continue
                    label = "-".join([key, *(f"{k}-{v}" for k, v in combo.items() if isinstance(value[k], list))])
                    add(cls_name, label, {k2: v2 for k, v in combo.items() for k2, v2 in _field(k, v).items()})
            else:
                for v in value if isinstance(value, list) else [value]:
                    label = f"beta-{v[0]}-{v[1]}" if key == "beta_start_end_pairs" else f"{key}-{v}"
                    add(cls_name, label, _field(key, v))
        if "prediction_type" in tester["variants"]:
            add(cls_name, "full-loop-v-prediction", {"prediction_type": "v_prediction"}, dummy=True)
    # Flow matching has no scheduler test on diffusers' main: the configs its pipeline tests
    # and the pull requests' tests build.
    flow = "FlowMatchEulerDiscreteScheduler"
    variants = TESTER_CONFIGS[flow]["variants"]
    add(flow, "base", {})
    add(flow, "full-loop", {}, dummy=True)
    add(flow, "shift-7p0", {"shift": 7.0})
    add(flow, "karras", {"use_karras_sigmas": True})
    add(flow, "invert", {"invert_sigmas": True})
    pr = variants["PR branch 3feb4d450c (index_for_timestep vectorization)"]
    for shift in pr["shift"]:
        for steps in pr["num_inference_steps"]:
            add(flow, f"shift-{shift}-steps-{steps}", {**pr["config"], "shift": shift, "steps": steps})
    for shift in variants["PR branch adb7fa425e (#13243 no double shift)"]["shift"]:
        add(flow, f"shift-{shift}", {"num_train_timesteps": 1000, "shift": shift})
    dyn = variants["PR branch 8f9866f5db"]["config"]
    for dynamic in dyn["use_dynamic_shifting"]:
        # A dynamic shift needs `mu`: the one of a 256-token image (base_shift 0.5).
        add(flow, f"shift-3-dynamic-{dynamic}", {**dyn, "use_dynamic_shifting": dynamic},
            mu=0.5 if dynamic else None)
    add(flow, "stochastic", variants["PR branch f5f9407baf"]["config"])
    return cases, skipped


# Tester cases also committed beside CASES (the sweep writes them all into a cache folder):
# each scheduler's full loop on the tests' dummy model, beta sigmas, thresholding with a
# sample_max_value below 1, a one-step training schedule.
TESTER_COMMITTED = ["tester-ddim-full-loop", "tester-ddpm-num-train-timesteps-1", "tester-euler-use-beta-sigmas-true",
                    "tester-dpmsolver-use-beta-sigmas-true", "tester-ddpm-variance-type-other",
                    "tester-euler-custom-sigmas-prediction-type-epsilon-final-sigmas-type-sigma-min",
                    "tester-dpmsolver-custom-timesteps-algorithm-type-sde-dpmsolverpp-prediction-type-epsilon-final-sigmas-type-zero",
                    "tester-dpmsolver-thresholding-solver-order-2-solver-type-heun-sample-max-value-0p5-prediction-type-epsilon",
                    "tester-lms-full-loop", "tester-pndm-full-loop"]


def write_tester_case(out: Path, name: str, c: dict, index: int) -> None:
    """One case of tester_cases() into `out`, with its `refused.json` where zoo refuses it."""
    trace(name, c["class"], c["config"], {}, 1, 8800 + index, out=out, steps=c["steps"], shape=TESTER_SHAPE,
          dummy_model=c["dummy"], timestep_kwargs=c["timesteps"])
    if c["refused"]:
        (out / name / "refused.json").write_text(json.dumps(c["refused"]) + "\n")


def write_tester(out: Path) -> None:
    """Writes every scheduler tester case into `out` (a cache folder) and its README.json,
    which lists the loops not covered."""
    out.mkdir(parents=True, exist_ok=True)
    cases, skipped = tester_cases()
    for i, (name, c) in enumerate(cases.items()):
        write_tester_case(out, name, c, i)
    versions = {p: importlib.metadata.version(p) for p in ("diffusers", "torch")}
    (out / "README.json").write_text(json.dumps({
        "command": f".venv/bin/python nightly/reference/schedulers.py --tester {out}",
        "library_versions": versions,
        "cases": list(cases),
        "not_covered": skipped,
        "refused": {n: c["refused"] for n, c in cases.items() if c["refused"]},
    }, indent=1) + "\n")
    print(f"wrote {len(cases)} scheduler tester cases into {out}; not covered: {skipped}")


def main() -> None:
    import sys

    torch.set_num_threads(1)
    if sys.argv[1:2] == ["--tester"]:
        write_tester(Path(sys.argv[2]))
        return
    OUT.mkdir(parents=True, exist_ok=True)
    for i, (name, (cls_name, overrides, kwargs, factor)) in enumerate(CASES.items()):
        trace(name, cls_name, overrides, kwargs, factor, 4200 + i)
        print("wrote", OUT / name)
    tester, _ = tester_cases()
    for i, (name, c) in enumerate(tester.items()):
        if name in TESTER_COMMITTED:
            write_tester_case(OUT, name, c, i)
            print("wrote", OUT / name)
    versions = {p: importlib.metadata.version(p) for p in ("diffusers", "torch")}
    (OUT / "README.json").write_text(json.dumps({
        "command": ".venv/bin/python nightly/reference/schedulers.py",
        "steps": STEPS,
        "library_versions": versions,
        "cases": list(CASES) + TESTER_COMMITTED,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
