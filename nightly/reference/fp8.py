"""Tiny random causal LMs saved as transformers' FP8 checkpoints (`quant_method: "fp8"`, the
format DeepSeek-V3 and Qwen3's FP8 releases use): every Linear but `lm_head` stored as
float8_e4m3fn with one f32 `weight_scale_inv` per block of `weight_block_size` (whole blocks:
transformers' CPU dequantization reads no partial ones), activations `dynamic`.

The weights are quantized as those releases are (each block's scale its largest magnitude
over 448, the values cast to E4M3) and written beside the config; the reference is what
transformers computes after `from_pretrained` of that folder on the CPU, which multiplies
the scales back in (`dequantize`: there are no FP8 kernels without an FP8 GPU, so
activations stay unquantized there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

import lm
from common import TORCH_DTYPES, Case
from lm import LmSpec

FP8_MAX = 448.0


@dataclass
class Fp8Spec:
    name: str
    base: LmSpec
    description: str
    features: list[str]
    block: list[int] | None


SPECS: list[Fp8Spec] = [
    Fp8Spec("llama-fp8-blocks-f32",
            LmSpec("base", "LlamaForCausalLM", "", [],
                   {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2},
                   seed=1301),
            "FP8 E4M3 weights with a scale per 32x32 block (weight_scale_inv, in "
            "f32), dequantized as transformers does on the CPU",
            ["gqa", "quantized", "fp8", "block"], [32, 32]),
]


def _quantize(weight: torch.Tensor, block: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = weight.shape
    br, bc = block
    grid = torch.empty((rows + br - 1) // br, (cols + bc - 1) // bc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            tile = weight[i * br:(i + 1) * br, j * bc:(j + 1) * bc].float()
            scale = tile.abs().max().clamp(min=1e-12) / FP8_MAX
            grid[i, j] = scale
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (tile / scale).to(torch.float8_e4m3fn)
    return q, grid


def _write(spec: Fp8Spec, base: LmSpec, out_dir: Path) -> None:
    lm.build_model(base).save_pretrained(out_dir)
    tensors = load_file(out_dir / "model.safetensors")
    for name in list(tensors):
        if name.endswith("proj.weight"):
            tensors[name], tensors[f"{name}_scale_inv"] = _quantize(tensors[name], spec.block)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": spec.block}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _reference(out_dir: Path, dtype: str) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=TORCH_DTYPES[dtype], attn_implementation="eager").eval()


def build_case(spec: Fp8Spec, out_dir: Path) -> Case:
    for attempt in range(lm.SEED_TRIES):
        base = replace(spec.base, seed=spec.base.seed + attempt * lm.SEED_STRIDE)
        _write(spec, base, out_dir)
        inputs = lm.make_inputs(base)
        greedy = lm.run_greedy(_reference(out_dir, base.dtype), inputs)
        if float(greedy[2].min()) >= lm.MIN_MARGIN[base.dtype]:
            break
    else:
        raise RuntimeError(f"{spec.name}: no seed gives a greedy margin >= {lm.MIN_MARGIN[base.dtype]}")
    named = replace(base, name=spec.name, description=spec.description, features=spec.features)
    return lm.case_of(named, _reference(out_dir, base.dtype), inputs, greedy)
