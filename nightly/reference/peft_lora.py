"""Tiny random causal LMs with PEFT LoRA adapters (LlamaForCausalLM, Qwen2ForCausalLM,
GPT2LMHeadModel).

The base checkpoint is saved as any lm.py case's; each adapter as `PeftModel.save_pretrained`
writes it (`adapter_N/adapter_config.json` + `adapter_model.safetensors`), after its lora_B,
lora_A, DoRA magnitudes and `modules_to_save` copies are drawn at random (PEFT initialises B
at zero, which would make any port pass). The reference is PEFT's own forward and greedy
generation with the adapters active and unmerged, each at its weight (`set_scale`); case.json
lists the adapters a port merges, in order, as `"adapters": [{"path": ..., "scale": ...}]`.

The specs cover what `adapter_config.json` can ask for: `all-linear` with rank and alpha
patterns and `modules_to_save` on the head; rsLoRA, an embedding LoRA and trained biases
(`bias="lora_only"`) in a second adapter merged after a first at other weights; DoRA on
GPT-2's `Conv1D`s (`fan_in_fan_out`, one of them square).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model

import lm
from common import Case
from gpt2 import GPT2_FAMILY
from lm import LmSpec


@dataclass
class LoraSpec:
    name: str
    base: LmSpec
    description: str
    features: list[str]
    # LoraConfig keyword arguments, plus "scale" (the adapter's weight, 1 by default).
    adapters: list[dict[str, Any]] = field(default_factory=list)


def _base(architecture: str, config: dict[str, Any] | None = None, **kw: Any) -> LmSpec:
    return LmSpec("base", architecture, "", [], config or {}, **kw)


SPECS: list[LoraSpec] = [
    LoraSpec(
        "llama-lora-f32",
        _base("LlamaForCausalLM", seed=1101),
        "LoRA on every linear layer (target_modules all-linear) with rank_pattern and alpha_pattern, and "
        "lm_head in modules_to_save",
        ["gqa", "untied", "lora", "lora:all-linear", "lora:rank-pattern", "lora:modules-to-save"],
        [dict(r=4, lora_alpha=8, target_modules="all-linear", rank_pattern={"q_proj": 2},
              alpha_pattern={r"layers\.1\.mlp\.up_proj": 3}, modules_to_save=["lm_head"])],
    ),
    LoraSpec(
        "qwen2-lora-two-f32",
        _base("Qwen2ForCausalLM", seed=1102),
        "two adapters merged in order at weights 0.5 and 1.5: rsLoRA on q/v with trained q/v biases "
        "(bias lora_only), then an embedding LoRA with o_proj and down_proj",
        ["gqa", "qkv-bias", "untied", "lora", "lora:rslora", "lora:bias", "lora:embedding", "lora:several"],
        [dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], use_rslora=True, bias="lora_only",
              scale=0.5),
         dict(r=4, lora_alpha=4, target_modules=["embed_tokens", "o_proj", "down_proj"], scale=1.5)],
    ),
    LoraSpec(
        "gpt2-dora-f32",
        replace(_base("GPT2LMHeadModel", seed=1103), family=GPT2_FAMILY, weight_std=0.3),
        "DoRA on GPT-2's Conv1D layers (fan_in_fan_out; c_proj is square), stored [in, out]",
        ["mha", "tied", "conv1d", "lora", "lora:dora", "lora:fan-in-fan-out"],
        [dict(r=2, lora_alpha=4, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True,
              use_dora=True)],
    ),
]

LORA_STD = 0.1


def _randomize_adapter(model: torch.nn.Module, name: str, seed: int) -> None:
    """Draws the adapter's own tensors at random: B and A of every pair, DoRA magnitudes near
    the norms PEFT initialised them to, `modules_to_save` copies, and (bias lora_only) the
    biases of the modules it targets."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if f"lora_magnitude_vector.{name}" in pname:
                param.copy_(param * (1.0 + 0.2 * noise))
            elif f".{name}." in pname or pname.endswith(f".{name}"):
                param.copy_(LORA_STD * noise)
            elif pname.endswith("base_layer.bias") and param.requires_grad:
                param.add_(0.1 * noise)


def _adapted(spec: LoraSpec, base: LmSpec) -> torch.nn.Module:
    """The model of `base` with every adapter of `spec` attached, drawn and active."""
    model = lm.build_model(base)
    peft_model = None
    names = []
    for i, adapter in enumerate(spec.adapters):
        kwargs = {k: v for k, v in adapter.items() if k != "scale"}
        config = LoraConfig(task_type="CAUSAL_LM", **kwargs)
        name = f"adapter_{i}"
        if peft_model is None:
            peft_model = get_peft_model(model, config, adapter_name=name)
        else:
            peft_model.add_adapter(name, config)
        _randomize_adapter(peft_model, name, base.seed * 10 + i)
        names.append(name)
    peft_model.base_model.set_adapter(names)
    for module in peft_model.modules():
        if hasattr(module, "set_scale") and hasattr(module, "scaling"):
            for i, adapter in enumerate(spec.adapters):
                module.set_scale(f"adapter_{i}", adapter.get("scale", 1.0))
    return peft_model.eval()


def build_case(spec: LoraSpec, out_dir: Path) -> Case:
    for attempt in range(lm.SEED_TRIES):
        base = replace(spec.base, seed=spec.base.seed + attempt * lm.SEED_STRIDE)
        model = _adapted(spec, base)
        inputs = lm.make_inputs(base)
        # PEFT wrote its layers into the transformers model itself: running that model runs them.
        greedy = lm.run_greedy(model.get_base_model(), inputs)
        if float(greedy[2].min()) >= lm.MIN_MARGIN[base.dtype]:
            break
    else:
        raise RuntimeError(f"{spec.name}: no seed gives a greedy margin >= {lm.MIN_MARGIN[base.dtype]}")
    # The base checkpoint is the model before any adapter (and before trained biases moved).
    lm.build_model(base).save_pretrained(out_dir)
    adapters = []
    for i, adapter in enumerate(spec.adapters):
        model.save_pretrained(out_dir, selected_adapters=[f"adapter_{i}"])
        adapters.append({"path": f"adapter_{i}", "scale": adapter.get("scale", 1.0)})
        # PEFT writes target_modules from a set, in hash order: sorted, reruns match.
        config_path = out_dir / f"adapter_{i}" / "adapter_config.json"
        config = json.loads(config_path.read_text())
        if isinstance(config.get("target_modules"), list):
            config["target_modules"] = sorted(config["target_modules"])
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out_dir / "README.md").unlink(missing_ok=True)  # PEFT's model card
    named = replace(base, name=spec.name, description=spec.description, features=spec.features)
    case = lm.case_of(named, _adapted(spec, base).get_base_model(), inputs, greedy)
    case.extra["adapters"] = adapters
    return case
