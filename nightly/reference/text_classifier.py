"""Writes transformers/tests/data/text_classifier/: a tiny random BERT text classifier
(BertForSequenceClassification, three labels) that reads all-MiniLM-L6-v2's tokenizer, and
expected.json: what transformers' `text-classification` pipeline makes of a few texts with
that tokenizer — every label's score (`top_k=None`) with the softmax it applies to several
labels, and again with `problem_type="multi_label_classification"`, where it applies a
sigmoid; the raw logits too; and text pairs (`{"text", "text_pair"}`, one input with the
tokenizer's separators) with the softmax. Only config.json and the weights are written; the test puts the
tokenizer files of all-MiniLM-L6-v2 (ZOO_MINILM_DIR, which scripts/fetch-test-assets.sh
obtains) beside them.

Run: ZOO_MINILM_DIR=... .venv/bin/python nightly/reference/text_classifier.py
"""

import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import randomize_parameters, save_with_minilm_tokenizer  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "transformers/tests/data/text_classifier"
LABELS = ["negative", "neutral", "positive"]
TEXTS = [
    "A wonderful film, the best I have seen this year.",
    "It was fine.",
    "The plot made no sense and the acting was worse.",
]
PAIRS = [
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("The cat sleeps on the sofa.", "Stock markets fell sharply on Monday."),
]


def scores(folder: Path, inputs=TEXTS) -> list[list[dict]]:
    classify = pipeline("text-classification", model=str(folder), device="cpu")
    return [[{"label": r["label"], "score": float(r["score"])} for r in row]
            for row in classify(inputs, top_k=None)]


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    minilm = Path(os.environ["ZOO_MINILM_DIR"])
    vocab = json.loads((minilm / "config.json").read_text())["vocab_size"]
    config = BertConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=64, pad_token_id=0,
                        id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    config.architectures = ["BertForSequenceClassification"]
    model = BertForSequenceClassification._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, 91, 0.5)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_with_minilm_tokenizer(model, OUT, minilm, folder)
        softmax = scores(folder)
        pairs = scores(folder, [{"text": a, "text_pair": b} for a, b in PAIRS])
        tok = AutoTokenizer.from_pretrained(str(folder))
        with torch.no_grad():
            logits = [model(**tok(t, return_tensors="pt")).logits[0].tolist() for t in TEXTS]
        multi = json.loads((folder / "config.json").read_text())
        multi["problem_type"] = "multi_label_classification"
        (folder / "config.json").write_text(json.dumps(multi))
        sigmoid = scores(folder)
    expected = {
        "texts": TEXTS,
        "labels": LABELS,
        "logits": logits,
        "softmax": softmax,
        "multi_label_sigmoid": sigmoid,
        "pairs": [list(p) for p in PAIRS],
        "pairs_softmax": pairs,
        "tokenizer": "all-MiniLM-L6-v2's tokenizer files (ZOO_MINILM_DIR), copied beside the weights",
        "library_versions": {p: importlib.metadata.version(p) for p in ("torch", "transformers")},
        "command": ".venv/bin/python nightly/reference/text_classifier.py",
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(json.dumps(softmax[0]))


if __name__ == "__main__":
    main()
