"""PyTorch's side of zoo's Mixtral benchmark (benchmarks/src/bin/mixtral.rs runs it in the same
session), and the writer of the random checkpoint both sides read.

--write DIR: saves a random-weight MixtralForCausalLM of about 330M parameters (8 experts,
top-2, hidden 1024, expert width 2560, 4 layers, vocab 32000) in f32 to DIR, seeded, with
transformers' own init; prints nothing else. Otherwise --model-dir DIR: loads it in f32 on CPU
with --threads threads (transformers' default attention and experts implementation) and
prints one JSON line: greedy decode tokens/s over --new tokens after the first (the best of
--runs), the load time and the process's peak RSS.

Run: .venv/bin/python nightly/reference/mixtral_bench.py (--write DIR | --model-dir DIR)
         [--new 32] [--threads 2] [--runs 3]
"""

import argparse
import json
import resource
import time

import torch
from transformers import MixtralConfig, MixtralForCausalLM

p = argparse.ArgumentParser()
src = p.add_mutually_exclusive_group(required=True)
src.add_argument("--write")
src.add_argument("--model-dir")
p.add_argument("--new", type=int, default=32)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--runs", type=int, default=3)
a = p.parse_args()
torch.set_num_threads(a.threads)

if a.write:
    config = MixtralConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2560, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    config.architectures = ["MixtralForCausalLM"]
    torch.manual_seed(0)
    model = MixtralForCausalLM._from_config(config, dtype=torch.float32)
    model.save_pretrained(a.write)
    raise SystemExit(0)

t0 = time.perf_counter()
model = MixtralForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32).eval()
load = time.perf_counter() - t0
# The same prompt ids as the Rust side: 100 + 37 i for 16 positions.
prompt = (torch.arange(16) * 37 + 100).unsqueeze(0)
kw = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}
decode_tps = 0.0
with torch.no_grad():
    model.generate(prompt, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
    for _ in range(a.runs):
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, min_new_tokens=1, **kw)
        first = time.perf_counter() - t
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=a.new + 1, min_new_tokens=a.new + 1, **kw)
        total = time.perf_counter() - t
        decode_tps = max(decode_tps, a.new / max(total - first, 1e-9))
print(json.dumps({
    "load_s": load,
    "decode_tokens": a.new,
    "decode_tok_s": decode_tps,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "threads": a.threads,
    "torch": torch.__version__,
    "parameters": sum(p.numel() for p in model.parameters()),
}))
