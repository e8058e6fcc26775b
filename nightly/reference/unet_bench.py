"""PyTorch's side of zoo's UNet benchmark (benchmarks/src/bin/unet.rs runs it in the same
session), and the writer of the random UNet both sides read.

--write DIR: saves a random-weight UNet2DConditionModel with Stable Diffusion 1.5's block
layout (CrossAttnDownBlock2D x3 + DownBlock2D, UNetMidBlock2DCrossAttn, the mirrored up
blocks, 2 layers per block, 8 heads, cross-attention width 768) at reduced width
(block_out_channels 64/128/256/256) in f32 to DIR, seeded, with diffusers' own init.
Otherwise --model-dir DIR: loads it in f32 on CPU with --threads threads and prints one JSON
line: the best of --runs seconds per UNet call on a batch of 2 (classifier-free guidance)
64x64 latents with 77 text positions, the load time and the process's peak RSS.

Run: .venv/bin/python nightly/reference/unet_bench.py (--write DIR | --model-dir DIR)
         [--threads 2] [--runs 3] [--size 64]
"""

import argparse
import json
import resource
import time

import torch
from diffusers import UNet2DConditionModel

p = argparse.ArgumentParser()
src = p.add_mutually_exclusive_group(required=True)
src.add_argument("--write")
src.add_argument("--model-dir")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--runs", type=int, default=3)
p.add_argument("--size", type=int, default=64)
a = p.parse_args()
torch.set_num_threads(a.threads)

if a.write:
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=64,
        block_out_channels=(64, 128, 256, 256),
        layers_per_block=2,
        cross_attention_dim=768,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    unet.save_pretrained(a.write)
    raise SystemExit(0)

t0 = time.perf_counter()
unet = UNet2DConditionModel.from_pretrained(a.model_dir, dtype=torch.float32).eval()
load = time.perf_counter() - t0
# The inputs the Rust side builds: zeros are as fast as any values on CPU.
sample = torch.zeros(2, 4, a.size, a.size)
context = torch.zeros(2, 77, 768)
t = torch.tensor([500.0])
best = float("inf")
with torch.no_grad():
    unet(sample, t, context)  # warm-up
    for _ in range(a.runs):
        t0 = time.perf_counter()
        unet(sample, t, context)
        best = min(best, time.perf_counter() - t0)
print(json.dumps({
    "load_s": load,
    "seconds_per_step": best,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "threads": a.threads,
    "torch": torch.__version__,
    "parameters": sum(p.numel() for p in unet.parameters()),
}))
