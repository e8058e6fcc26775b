"""PyTorch's side of zoo's Flux transformer benchmark (benchmarks/src/bin/flux.rs runs it in
the same session), and the writer of the random transformer both sides read.

--write DIR: saves a random-weight FluxTransformer2DModel shaped like FLUX.1 at reduced width
and depth (4 heads of 64, 2 double-stream and 4 single-stream blocks, rotary axes 8/28/28,
T5 width 512, pooled width 768, guidance embedding, 64 packed channels) in f32 to DIR,
seeded, with diffusers' own init.
Otherwise --model-dir DIR: loads it in --dtype (float32 or bfloat16) on CPU with --threads threads
and prints one JSON line: the best of --runs seconds per transformer call for a 256x256 image
(16x16 = 256 packed latent tokens) with --text text tokens, the load time and the peak RSS.

Run: .venv/bin/python nightly/reference/flux_bench.py (--write DIR | --model-dir DIR)
         [--dtype float32] [--threads 2] [--runs 3] [--text 128]
"""

import argparse
import json
import resource
import time

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel

p = argparse.ArgumentParser()
src = p.add_mutually_exclusive_group(required=True)
src.add_argument("--write")
src.add_argument("--model-dir")
p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--runs", type=int, default=3)
p.add_argument("--text", type=int, default=128)
a = p.parse_args()
torch.set_num_threads(a.threads)

if a.write:
    torch.manual_seed(0)
    FluxTransformer2DModel(
        in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=64, num_attention_heads=4,
        joint_attention_dim=512, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(8, 28, 28),
    ).save_pretrained(a.write)
    raise SystemExit(0)

t0 = time.perf_counter()
dt = getattr(torch, a.dtype)
model = FluxTransformer2DModel.from_pretrained(a.model_dir, dtype=dt).eval()
load = time.perf_counter() - t0
# The inputs the Rust side builds, in the model's dtype: zeros are as fast as any values on CPU.
latents = torch.zeros(1, 256, 64, dtype=dt)
context = torch.zeros(1, a.text, 512, dtype=dt)
pooled = torch.zeros(1, 768, dtype=dt)
img_ids = FluxPipeline._prepare_latent_image_ids(1, 16, 16, "cpu", dt)
txt_ids = torch.zeros(a.text, 3, dtype=dt)
kw = dict(hidden_states=latents, encoder_hidden_states=context, pooled_projections=pooled,
          timestep=torch.tensor([0.5], dtype=dt), guidance=torch.tensor([3.5], dtype=dt),
          img_ids=img_ids, txt_ids=txt_ids)
best = float("inf")
with torch.no_grad():
    model(**kw)  # warm-up
    for _ in range(a.runs):
        t0 = time.perf_counter()
        model(**kw)
        best = min(best, time.perf_counter() - t0)
print(json.dumps({
    "load_s": load,
    "seconds_per_step": best,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "threads": a.threads,
    "dtype": a.dtype,
    "torch": torch.__version__,
    "parameters": sum(p.numel() for p in model.parameters()),
}))
