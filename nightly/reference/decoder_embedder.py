"""Writes transformers/tests/data/qwen3_embedder/: a tiny random Qwen3 decoder saved as a
sentence-transformers model the way the decoder embedders publish one (Qwen3-Embedding,
gte-Qwen2): the transformer at the root, a byte-level tokenizer that pads on the left,
modules.json (Transformer -> Pooling -> Normalize), 1_Pooling/config.json with `lasttoken`
pooling and 2_Normalize, config_sentence_transformers.json with query and document prompts;
and expected.json: what sentence-transformers makes of five sentences with it
(`SentenceTransformer(dir).encode`, a batch of different lengths), plain and with the query
prompt (`prompt_name="query"`).

Run: .venv/bin/python nightly/reference/decoder_embedder.py
"""

import importlib.metadata
import json
import shutil
import sys
from pathlib import Path

import torch
from sentence_transformers import SentenceTransformer
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import randomize_parameters  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "transformers/tests/data/qwen3_embedder"
SENTENCES = ["The cat sat on the mat.", "Rust is fast", "A much longer sentence about embeddings, "
             "padding and the last token of each row.", "ok", "Ünïcödé text"]
EOS = "<|endoftext|>"
PROMPTS = {"query": "Instruct: Given a question, find the passage that answers it\nQuery:", "document": ""}


def byte_char(b: int) -> str:
    """GPT-2's byte -> printable character map (one token per byte)."""
    def printable(x: int) -> bool:
        return 33 <= x <= 126 or 0xA1 <= x <= 0xAC or 0xAE <= x <= 0xFF
    return chr(b) if printable(b) else chr(256 + sum(1 for x in range(b) if not printable(x)))


def tokenizer_json() -> dict:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 256, "content": EOS, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}],
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "vocab": {byte_char(b): b for b in range(256)}, "merges": []}}


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    (OUT / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
        "padding_side": "left", "model_max_length": 64}, indent=1))
    config = Qwen3Config(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                         pad_token_id=256, eos_token_id=256, tie_word_embeddings=False)
    config.architectures = ["Qwen3Model"]
    model = Qwen3Model._from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_parameters(model, 4242, 0.1)
    model.eval().save_pretrained(OUT)
    (OUT / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}], indent=1))
    (OUT / "1_Pooling").mkdir()
    (OUT / "1_Pooling/config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                           "pooling_mode_lasttoken": True}, indent=1))
    (OUT / "2_Normalize").mkdir()
    (OUT / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    # The query and document prompts, as Qwen3-Embedding's folder names them.
    (OUT / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=1))
    st = SentenceTransformer(str(OUT), device="cpu")
    st.eval()
    assert isinstance(st.tokenizer, PreTrainedTokenizerFast) and st.tokenizer.padding_side == "left"
    embeddings = st.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    queries = st.encode(SENTENCES, prompt_name="query", batch_size=len(SENTENCES), convert_to_numpy=True)
    expected = {
        "sentences": SENTENCES,
        "input_ids": [st.tokenizer(s)["input_ids"] for s in SENTENCES],
        "pooling": "lasttoken", "normalize": True,
        "embeddings": [[float(x) for x in row] for row in embeddings],
        "prompts": PROMPTS,
        "query_embeddings": [[float(x) for x in row] for row in queries],
        "library_versions": {p: importlib.metadata.version(p)
                             for p in ("torch", "transformers", "sentence-transformers")},
        "command": ".venv/bin/python nightly/reference/decoder_embedder.py",
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
