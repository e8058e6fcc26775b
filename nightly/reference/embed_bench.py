"""sentence-transformers' side of zoo's embedding benchmark (benchmarks/src/bin/embed.rs runs
it in the same session), and the writer of the random-weight sentence encoders both sides read.

--write DIR [--shape mpnet|modernbert]: saves a random-weight MPNet with all-mpnet-base-v2's
shape (MPNetConfig's defaults: 12 layers of 768, 12 heads, MLP 3072, 30527 ids, 514
positions), or a ModernBERT with ModernBERT-base's (ModernBertConfig's defaults: 22 layers of
768, 12 heads, gated MLP 1152, local attention 128 in two of three layers), as a
sentence-transformers folder (Transformer -> mean Pooling -> Normalize, max_seq_length 384),
seeded, with all-MiniLM-L6-v2's WordPiece tokenizer (ZOO_MINILM_DIR) for its ids.
Otherwise --model-dir DIR --sentences FILE: loads DIR with SentenceTransformer on CPU with
--threads threads and prints one JSON line: the best of --runs sentences per second encoding
the first sentence alone (batch 1) and all of them in one batch.

Run: .venv/bin/python nightly/reference/embed_bench.py (--write DIR [--shape S] | --model-dir DIR --sentences FILE)
         [--threads 2] [--runs 3]
"""

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

p = argparse.ArgumentParser()
src = p.add_mutually_exclusive_group(required=True)
src.add_argument("--write")
src.add_argument("--model-dir")
p.add_argument("--shape", choices=("mpnet", "modernbert"), default="mpnet")
p.add_argument("--sentences")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--runs", type=int, default=3)
a = p.parse_args()
torch.set_num_threads(a.threads)

if a.write:
    from transformers import ModernBertConfig, ModernBertModel, MPNetConfig, MPNetModel

    torch.manual_seed(0)
    out = Path(a.write)
    out.mkdir(parents=True, exist_ok=True)
    config_class, model_class = ((ModernBertConfig, ModernBertModel) if a.shape == "modernbert"
                                 else (MPNetConfig, MPNetModel))
    config = config_class()
    config.architectures = [model_class.__name__]
    model_class(config).eval().save_pretrained(out)
    minilm = Path(os.environ["ZOO_MINILM_DIR"])
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm / f).exists():
            shutil.copy(minilm / f, out / f)
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling/config.json").write_text(json.dumps({"word_embedding_dimension": 768,
                                                           "pooling_mode_mean_tokens": True}))
    (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 384, "do_lower_case": False}))
    raise SystemExit(0)

from sentence_transformers import SentenceTransformer  # noqa: E402

sentences = json.loads(Path(a.sentences).read_text())
t0 = time.perf_counter()
model = SentenceTransformer(a.model_dir, device="cpu")
load = time.perf_counter() - t0


def rate(batch: list[str]) -> float:
    model.encode(batch, batch_size=len(batch))  # warm-up
    best = float("inf")
    for _ in range(a.runs):
        t0 = time.perf_counter()
        model.encode(batch, batch_size=len(batch))
        best = min(best, time.perf_counter() - t0)
    return len(batch) / best


with torch.no_grad():
    one, many = rate(sentences[:1]), rate(sentences)
print(json.dumps({"load_s": load, "batch1_per_s": one, "batch_per_s": many, "batch": len(sentences),
                  "threads": a.threads, "torch": torch.__version__}))
