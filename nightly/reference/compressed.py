"""Tiny random causal LMs saved as compressed-tensors checkpoints (`quant_method:
"compressed-tensors"`), as llm-compressor writes them: weight-only int4/int8 (`pack-quantized`,
symmetric and asymmetric, group and channel strategies) and FP8 (`float-quantized`).

Each model is built as lm.py builds it, its Linear layers given a quantization scheme by
compressed-tensors (`apply_quantization_config`), their scales and zero points computed from
the weights' group minima and maxima (`calculate_qparams`, the min-max observer's result),
then compressed and saved by `ModelCompressor`. The reference is what transformers computes
after loading that checkpoint (`from_pretrained` decompresses it on the CPU).

The f32 cases round each scale to four significant bits first, so every dequantized weight
`scale * q` is exact in any float dtype: zoo runs them as it runs a quantized checkpoint by
default, its weights kept as blocks (Q4_0, Q8_0) and products computed in f32, and meets
transformers' numbers to f32 tolerance. The bf16 cases keep the scales as computed and run
dequantized, rounding as transformers rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                             apply_quantization_config)
from compressed_tensors.quantization.utils import calculate_qparams

import lm
from common import Case
from lm import LmSpec

# Hidden sizes that hold whole 32-wide blocks.
CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}


@dataclass
class CompressedSpec:
    name: str
    base: LmSpec
    description: str
    features: list[str]
    weights: dict[str, Any]
    format: str
    coarse_scales: bool = False


def _base(architecture: str, dtype: str, seed: int) -> LmSpec:
    return LmSpec("base", architecture, "", [], dict(CONFIG), dtype=dtype, seed=seed)


SPECS: list[CompressedSpec] = [
    CompressedSpec("llama-w4a16-f32", _base("LlamaForCausalLM", "f32", 1201),
                   "W4A16: int4 symmetric, groups of 32, pack-quantized; kept as Q4_0 blocks",
                   ["gqa", "untied", "quantized", "compressed-tensors", "int4", "group"],
                   dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32),
                   "pack-quantized", coarse_scales=True),
    CompressedSpec("qwen2-w8a16-f32", _base("Qwen2ForCausalLM", "f32", 1202),
                   "W8A16: int8 symmetric per output channel, pack-quantized; kept as Q8_0 blocks",
                   ["gqa", "qkv-bias", "quantized", "compressed-tensors", "int8", "channel"],
                   dict(num_bits=8, type="int", symmetric=True, strategy="channel"),
                   "pack-quantized", coarse_scales=True),
    CompressedSpec("llama-w4a16-asym-bf16", _base("LlamaForCausalLM", "bf16", 1203),
                   "int4 asymmetric (packed zero points), groups of 64, in bfloat16",
                   ["gqa", "quantized", "compressed-tensors", "int4", "asymmetric", "group", "bf16"],
                   dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=64),
                   "pack-quantized"),
    CompressedSpec("llama-fp8-bf16", _base("LlamaForCausalLM", "bf16", 1204),
                   "FP8 E4M3 weights per output channel (float-quantized, weights only), in bfloat16",
                   ["gqa", "quantized", "compressed-tensors", "fp8", "channel", "bf16"],
                   dict(num_bits=8, type="float", symmetric=True, strategy="channel"),
                   "float-quantized"),
]


def _coarse(scale: torch.Tensor) -> torch.Tensor:
    """`scale` rounded to four significant bits (never to zero)."""
    mantissa, exponent = torch.frexp(scale.float())
    return torch.ldexp(torch.round(mantissa * 16) / 16, exponent).to(scale.dtype)


def _quantize(model: torch.nn.Module, spec: CompressedSpec) -> None:
    """Gives every Linear but lm_head the spec's weight scheme with min-max scales."""
    args = QuantizationArgs(**spec.weights)
    config = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
        ignore=["lm_head"], format=spec.format)
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            if not hasattr(module, "weight_scale"):
                continue
            w = module.weight.float()
            if args.strategy == "group":
                w = w.reshape(w.shape[0], -1, args.group_size)
            else:
                w = w.unsqueeze(1)
            scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), args)
            if spec.coarse_scales:
                scale = _coarse(scale)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))


def _saved(spec: CompressedSpec, base: LmSpec, out_dir: Path) -> torch.nn.Module:
    model = lm.build_model(base)
    _quantize(model, spec)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=spec.format)
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(out_dir)
    # What a loader computes from the saved tensors: compressed-tensors' own decompression
    # (transformers' from_pretrained runs it too, but in this stack cannot read packed
    # asymmetric zero points back).
    compressor.decompress_model(model)
    return model.eval()


def build_case(spec: CompressedSpec, out_dir: Path) -> Case:
    for attempt in range(lm.SEED_TRIES):
        base = replace(spec.base, seed=spec.base.seed + attempt * lm.SEED_STRIDE)
        for stale in out_dir.iterdir():
            stale.unlink()
        model = _saved(spec, base, out_dir)
        inputs = lm.make_inputs(base)
        greedy = lm.run_greedy(model, inputs)
        if float(greedy[2].min()) >= lm.MIN_MARGIN[base.dtype]:
            break
    else:
        raise RuntimeError(f"{spec.name}: no seed gives a greedy margin >= {lm.MIN_MARGIN[base.dtype]}")
    named = replace(base, name=spec.name, description=spec.description, features=spec.features)
    return lm.case_of(named, _saved(spec, base, out_dir), inputs, greedy)
