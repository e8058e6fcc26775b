"""PyTorch's side of zoo's SmolLM2 benchmark (transformers/benches/smollm2.rs runs it in the same
session): SmolLM2-135M-Instruct Q4_1 GGUF loaded by transformers (dequantized to f32), on CPU with
2 threads, eager attention off (transformers' default sdpa).

Prints one JSON line: prefill tokens/s over a 512-token prompt, greedy decode tokens/s over
--new tokens after the first (each the best of 3 runs), and the process's peak RSS.

Run: .venv/bin/python nightly/reference/smollm2_bench.py GGUF [--new 64] [--prefill 512]
"""

import argparse
import json
import os
import resource
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

p = argparse.ArgumentParser()
p.add_argument("gguf")
p.add_argument("--new", type=int, default=64)
p.add_argument("--prefill", type=int, default=512)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()
torch.set_num_threads(a.threads)
folder, name = os.path.dirname(a.gguf), os.path.basename(a.gguf)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
t0 = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
load = time.perf_counter() - t0

# Prefill: one forward over a prompt of exactly --prefill tokens, logits for the last
# position only, as generation asks for them (best of 3).
ids = torch.arange(1000, 1000 + a.prefill).remainder(40000).unsqueeze(0) + 100
best = float("inf")
with torch.no_grad():
    for _ in range(3):
        t = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)  # what generation computes
        best = min(best, time.perf_counter() - t)
prefill_tps = a.prefill / best

# Decode: greedy, eos suppressed, timed after the first token (prefill excluded); best of 3,
# since a shared machine's other load only ever slows a run down.
prompt = tok("The history of the city of Paris", return_tensors="pt").input_ids
decode_tps = 0.0
with torch.no_grad():
    model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
    for _ in range(3):
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
