"""Writes transformers/tests/data/t5_tokenizer/: a T5 tokenizer as transformers writes it (the
tokenizer.json of `T5Tokenizer`: a Unigram model, the Metaspace pre-tokenizer, the `$A </s>`
post-processor, `<extra_id_N>` sentinels) over a small vocabulary, and expected.json: the ids
transformers gives a list of texts, plain and as pipelines call it (padding="max_length",
truncation, max_length; PixArt and SD3 pad T5 prompts so).

The vocabulary holds whole words (scored above their pieces), single characters and digits,
so texts mix words, character fallbacks and `<unk>`. The texts exercise casing, punctuation
glued to words, whitespace runs, digits, accents and emoji (unknown characters), the
sentinels inline and truncation past max_length.

Run: .venv/bin/python nightly/reference/t5_tokenizer.py
"""

import importlib.metadata
import json
import os

from transformers import AutoTokenizer, T5Tokenizer

OUT = os.path.join(os.path.dirname(__file__), "../../transformers/tests/data/t5_tokenizer")
MAX_LENGTH = 16
WORDS = ["a", "photo", "of", "the", "cat", "dog", "translate", "English", "to", "German", "How", "old", "are", "you",
         "hello", "world", "red", "and", "in", "on", "summarize", "it", "is", "caf\u00e9"]
CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"-()")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(f"\u2581{w}", -1.0 - 1.0 / len(w)) for w in WORDS]
    pieces += [(w, -3.0 - 1.0 / len(w)) for w in WORDS]
    pieces += [(c, -6.0) for c in CHARS]
    T5Tokenizer(vocab=pieces, extra_ids=4, model_max_length=MAX_LENGTH).save_pretrained(OUT)
    tok = AutoTokenizer.from_pretrained(OUT)
    texts = [
        "a photo of the cat",
        "A PHOTO of The Cat!!",
        "translate English to German: How old are you?",
        "  two\tspaced \n\n lines  ",
        "numbers 12345 and 3.14",
        "caf\u00e9 vs cafe\u0301 and \u00fcber",
        "emoji \U0001F600\U0001F408 and symbols #@!$",
        "summarize: <extra_id_0> is <extra_id_1> red",
        "a photo of a red dog and a cat in the world on a hello photo of the dog",
        "",
    ]
    cases = []
    for text in texts:
        padded = tok(text, padding="max_length", max_length=MAX_LENGTH, truncation=True)
        cases.append({
            "text": text,
            "ids": tok(text).input_ids,
            "pipeline_ids": padded.input_ids,
            "pipeline_mask": padded.attention_mask,
            "decoded": tok.decode(tok(text).input_ids, skip_special_tokens=True),
        })
    result = {
        "max_length": MAX_LENGTH,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "cases": cases,
        "tokenizer": type(tok).__name__,
        "command": ".venv/bin/python nightly/reference/t5_tokenizer.py",
        "library_versions": {p: importlib.metadata.version(p) for p in ["transformers", "tokenizers"]},
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(cases[:3], ensure_ascii=False))


if __name__ == "__main__":
    main()
