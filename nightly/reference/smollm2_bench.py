"""PyTorch's side of zoo's SmolLM2 benchmark (benchmarks/src/bin/smollm2.rs runs it in the same
session): SmolLM2-135M-Instruct in f32 on CPU with --threads threads, transformers' default
attention (sdpa), from the f32 safetensors folder zoo and candle-transformers also read
(`--model-dir`, written by smollm2_export.py) or from the GGUF (`--gguf`, dequantized at load).

Prints one JSON line: prefill tokens/s over a --prefill-token prompt (logits for the last
position only, as generation computes them), greedy decode tokens/s over --new tokens after
the first (each the best of --runs), the load time and the process's peak RSS.

Run: .venv/bin/python nightly/reference/smollm2_bench.py (--model-dir DIR | --gguf FILE)
         [--new 48] [--prefill 512] [--threads 2] [--runs 3]
"""

import argparse
import json
import os
import resource
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

p = argparse.ArgumentParser()
src = p.add_mutually_exclusive_group(required=True)
src.add_argument("--model-dir")
src.add_argument("--gguf")
p.add_argument("--new", type=int, default=48)
p.add_argument("--prefill", type=int, default=512)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--runs", type=int, default=3)
a = p.parse_args()
torch.set_num_threads(a.threads)
if a.gguf:
    folder, kw = os.path.dirname(a.gguf), {"gguf_file": os.path.basename(a.gguf)}
else:
    folder, kw = a.model_dir, {}
tok = AutoTokenizer.from_pretrained(folder, **kw)
t0 = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw).eval()
load = time.perf_counter() - t0

# The same prompt ids as the Rust side: 100 + (1000 + i) % 40000.
ids = torch.arange(1000, 1000 + a.prefill).remainder(40000).unsqueeze(0) + 100
best = float("inf")
with torch.no_grad():
    for _ in range(a.runs):
        t = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)
        best = min(best, time.perf_counter() - t)
prefill_tps = a.prefill / best

# Greedy, eos suppressed, timed after the first token (prefill excluded).
prompt = tok("The history of the city of Paris", return_tensors="pt").input_ids
decode_tps = 0.0
with torch.no_grad():
    model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
    for _ in range(a.runs):
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        first = time.perf_counter() - t
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=a.new + 1, min_new_tokens=a.new + 1, do_sample=False)
        total = time.perf_counter() - t
        decode_tps = max(decode_tps, a.new / max(total - first, 1e-9))
print(json.dumps({
    "load_s": load,
    "prefill_tokens": a.prefill,
    "prefill_tok_s": prefill_tps,
    "decode_tokens": a.new,
    "decode_tok_s": decode_tps,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "threads": a.threads,
    "torch": torch.__version__,
}))
