"""Helpers shared by every case builder: determinism, random weights, case writing.

A case folder is described in ``nightly/README.md``. Everything written here must be
bit-identical across reruns on any machine with the pinned stack, so:

* every random draw comes from an explicit ``torch.Generator`` seeded per case,
* torch runs single-threaded with deterministic algorithms (a different thread count
  may reorder float reductions),
* JSON is written with sorted keys where order carries no meaning.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

FORMAT_VERSION = 1

# Tolerances agreed in the Llama-family issue: torch.allclose semantics per element.
TOLERANCES = {
    "f32": {"atol": 1e-4, "rtol": 1e-4},
    "bf16": {"atol": 2e-2, "rtol": 2e-2},
    # Not fixed by an issue yet; half precision gets bf16's tolerance.
    "f16": {"atol": 2e-2, "rtol": 2e-2},
}
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
}


def make_deterministic() -> None:
    """Pins torch to one thread and deterministic kernels so reruns are bit-identical."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose numbers end up in the case."""
    import diffusers
    import gguf
    import numpy
    import safetensors
    import transformers

    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "diffusers": diffusers.__version__,
        "safetensors": safetensors.__version__,
        "gguf": getattr(gguf, "__version__", _dist_version("gguf")),
        "numpy": numpy.__version__,
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def command_line() -> str:
    """The command that made this case, relative to the repository root when possible."""
    return shlex.join([_relative(Path(sys.executable)), _relative(Path(sys.argv[0])), *sys.argv[1:]])


def _relative(path: Path) -> str:
    # Not resolved: the venv's python is a symlink and its own path is what a reader reruns.
    absolute = path if path.is_absolute() else Path.cwd() / path
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def randomize_parameters(model: torch.nn.Module, seed: int, std: float) -> None:
    """Overwrites every parameter with seeded random values.

    The libraries' own init leaves norm weights at 1 and biases at 0, which would let a
    port that forgets to load them pass. Here norm scales are drawn around 1 and biases
    around 0, so every tensor in the checkpoint changes the output.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if _is_norm_weight(name):
                value = 1.0 + 0.1 * noise
            elif name.endswith("bias"):
                value = 0.1 * noise
            else:
                value = std * noise
            param.copy_(value.to(param.dtype))


MINILM_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def save_with_minilm_tokenizer(model: torch.nn.Module, out: Path, minilm: Path, folder: Path) -> None:
    """Saves `model` alone to `out` (what is committed: config.json and the weights) and the
    same files with all-MiniLM-L6-v2's tokenizer files from `minilm` to `folder`, the folder
    the reference libraries read (as the tests put the tokenizer beside the weights)."""
    import shutil

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    for f in out.iterdir():
        shutil.copy(f, folder / f.name)
    for f in MINILM_TOKENIZER_FILES:
        if (minilm / f).exists():
            shutil.copy(minilm / f, folder / f)


def cast_as_loaded(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` in `dtype` as `from_pretrained(dir, dtype=dtype)` would load its checkpoint:
    the rotary `inv_freq` buffers stay f32 (they are computed at init, not loaded); a plain
    `.to(dtype)` would round them too and give outputs no loader of the saved checkpoint
    reproduces."""
    rotary = {n: b.clone() for n, b in model.named_buffers() if n.rsplit(".", 1)[-1].endswith("inv_freq")}
    model = model.to(dtype).eval()
    for name, buf in rotary.items():
        owner, attr = name.rsplit(".", 1)
        model.get_submodule(owner)._buffers[attr] = buf
    return model


def run_capturing(points: dict[str, torch.nn.Module], run) -> tuple[Any, dict[str, torch.Tensor]]:
    """Calls `run()` under no_grad with forward hooks on `points`; returns its result and the
    output of each point as `<name>.output` (a tuple output's first element)."""
    captured: dict[str, torch.Tensor] = {}

    def capture(name):
        def hook(_module, _args, output):
            captured[name] = output[0] if isinstance(output, tuple) else output

        return hook

    hooks = [m.register_forward_hook(capture(f"{n}.output")) for n, m in points.items()]
    try:
        with torch.no_grad():
            out = run()
    finally:
        for hook in hooks:
            hook.remove()
    return out, captured


def _is_norm_weight(name: str) -> bool:
    lowered = name.lower()
    # GPT-2 names its LayerNorms ln_1, ln_2, ln_f.
    is_norm = "norm" in lowered or any(part.startswith("ln_") for part in lowered.split("."))
    return lowered.endswith("weight") and is_norm


@dataclass
class TensorSpec:
    """One named tensor of inputs.safetensors or expected.safetensors, as case.json lists it."""

    name: str
    tensor: torch.Tensor
    meaning: str
    compare: str | None = None  # "allclose" or "exact"; only for outputs
    mask: str | None = None  # name of an input whose zeros mark positions to skip
    tolerance: dict[str, float] | None = None  # overrides the case's tolerance

    def describe(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "dtype": SAFETENSORS_DTYPES[self.tensor.dtype],
            "shape": list(self.tensor.shape),
            "meaning": self.meaning,
        }
        if self.compare is not None:
            entry["compare"] = self.compare
        if self.mask is not None:
            entry["mask"] = self.mask
        if self.tolerance is not None:
            entry["tolerance"] = self.tolerance
        return entry


@dataclass
class Case:
    """Everything a case folder holds besides the checkpoint files."""

    name: str
    architecture: str
    model_type: str
    task: str
    dtype: str
    seed: int
    description: str
    features: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    checkpoint: dict[str, str] = field(default_factory=lambda: {"path": ".", "format": "safetensors"})
    generation: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    tolerance: dict[str, float] | None = None


def write_case(case: Case, out_dir: Path, reference: dict[str, Any]) -> None:
    """Writes inputs.safetensors, expected.safetensors and case.json into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _save_tensors(case.inputs, out_dir / "inputs.safetensors")
    _save_tensors(case.outputs, out_dir / "expected.safetensors")
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "name": case.name,
        "architecture": case.architecture,
        "model_type": case.model_type,
        "task": case.task,
        "dtype": case.dtype,
        "tolerance": case.tolerance or TOLERANCES[case.dtype],
        "seed": case.seed,
        "description": case.description,
        "features": case.features,
        "checkpoint": case.checkpoint,
        "inputs": [t.describe() for t in case.inputs],
        "outputs": [t.describe() for t in case.outputs],
        "generation": case.generation,
        "reference": reference,
    }
    doc.update(case.extra)
    (out_dir / "case.json").write_text(json.dumps(doc, indent=2) + "\n")


def _save_tensors(specs: list[TensorSpec], path: Path) -> None:
    # clone(): two names may view one buffer (a last layer is the model output).
    tensors = {s.name: s.tensor.detach().cpu().clone().contiguous() for s in specs}
    # No metadata: it would only repeat case.json and invite disagreement.
    save_file(tensors, str(path))


def reference_block(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The case.json "reference" object: who made the numbers and how."""
    block = {
        "generator": "nightly/reference/generate.py",
        "command": command_line(),
        "library_versions": library_versions(),
        "torch_threads": torch.get_num_threads(),
        "device": "cpu",
    }
    if extra:
        block.update(extra)
    return block


