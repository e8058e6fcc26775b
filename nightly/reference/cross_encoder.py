"""Writes transformers/tests/data/cross_encoder/: a tiny random BERT reranker
(BertForSequenceClassification, one label, as the ms-marco MiniLM cross-encoders ship) that
reads all-MiniLM-L6-v2's tokenizer, and expected.json: what sentence-transformers'
CrossEncoder makes of it with that tokenizer (`predict` on query-document pairs, one document
long enough to be cut at the model's 64 positions, and `rank`). Only config.json and the
weights are written; the test puts the tokenizer files of all-MiniLM-L6-v2
(ZOO_MINILM_DIR, which scripts/fetch-test-assets.sh obtains) beside them.

Run: ZOO_MINILM_DIR=... .venv/bin/python nightly/reference/cross_encoder.py
"""

import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from sentence_transformers import CrossEncoder
from transformers import BertConfig, BertForSequenceClassification

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import randomize_parameters, save_with_minilm_tokenizer  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "transformers/tests/data/cross_encoder"
QUERY = "How many people live in Berlin?"
DOCUMENTS = [
    "Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.",
    "New York City is famous for the Metropolitan Museum of Art.",
    "Berlin is the capital of Germany. " * 12,
    "ok",
]


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    minilm = Path(os.environ["ZOO_MINILM_DIR"])
    vocab = json.loads((minilm / "config.json").read_text())["vocab_size"]
    config = BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, num_labels=1, pad_token_id=0)
    config.architectures = ["BertForSequenceClassification"]
    model = BertForSequenceClassification._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, 77, 0.3)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_with_minilm_tokenizer(model, OUT, minilm, folder)
        ce = CrossEncoder(str(folder), device="cpu")
        pairs = [(QUERY, d) for d in DOCUMENTS]
        scores = ce.predict(pairs, convert_to_numpy=True).tolist()
        logits = ce.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True).tolist()
        ranked = ce.rank(QUERY, DOCUMENTS)
        lengths = [len(ce.tokenizer(q, d, truncation=True, max_length=ce.max_seq_length)["input_ids"])
                   for q, d in pairs]
        expected = {
            "query": QUERY, "documents": DOCUMENTS,
            "max_seq_length": ce.max_seq_length,
            "activation": type(ce.activation_fn).__name__,
            "token_counts": lengths,
            "scores": scores, "logits": logits,
            "rank": [{"corpus_id": int(r["corpus_id"]), "score": float(r["score"])} for r in ranked],
            "tokenizer": "all-MiniLM-L6-v2's tokenizer files (ZOO_MINILM_DIR), copied beside the weights",
            "library_versions": {p: importlib.metadata.version(p)
                                 for p in ("torch", "transformers", "sentence-transformers")},
            "command": ".venv/bin/python nightly/reference/cross_encoder.py",
        }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(json.dumps({k: expected[k] for k in ("max_seq_length", "activation", "token_counts", "scores")}))


if __name__ == "__main__":
    main()
