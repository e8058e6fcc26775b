"""Writes hub/tests/data/clip_tokenizer/: a CLIP tokenizer as diffusion repos ship it
(vocab.json, merges.txt, tokenizer_config.json with tokenizer_class CLIPTokenizer, no
tokenizer.json) and expected.json: the ids transformers' AutoTokenizer gives a list of texts,
plain and as pipelines call it (padding="max_length", truncation, max_length).

The vocabulary is CLIP's construction on a small scale: the 256 byte symbols, each with
`</w>` (a word's last symbol), the merged symbols, then <|startoftext|> and <|endoftext|>
(the highest ids). The merges cover a few English words, so texts mix merged and byte-level
pieces. The texts exercise the normalizer (NFC, whitespace runs, lowercase), the split
(contractions, letters, single digits, symbol runs, the special tokens inline), non-ASCII
bytes (accents, emoji) and truncation past max_length.

Run: .venv/bin/python nightly/reference/clip_tokenizer.py
"""

import importlib.metadata
import json
import os

from transformers import AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

OUT = os.path.join(os.path.dirname(__file__), "../../hub/tests/data/clip_tokenizer")
MAX_LENGTH = 16

WORDS = ["a</w>", "photo</w>", "of</w>", "cat</w>", "dog</w>", "hello</w>", "world</w>", "the</w>", "and</w>",
         "an</w>", "in</w>", "on</w>", "red</w>"]


def merges_for(word: str) -> list[str]:
    """Left-to-right merges that build `word` (ending in </w>) from its symbols."""
    body = word[:-4]
    symbols = list(body[:-1]) + [body[-1] + "</w>"]
    out = []
    while len(symbols) > 1:
        out.append(f"{symbols[0]} {symbols[1]}")
        symbols = [symbols[0] + symbols[1]] + symbols[2:]
    return out


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    byte_symbols = list(bytes_to_unicode().values())
    vocab = byte_symbols + [b + "</w>" for b in byte_symbols]
    merges: list[str] = []
    for word in WORDS:
        for m in merges_for(word):
            if m not in merges:
                merges.append(m)
                vocab.append(m.replace(" ", ""))
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    with open(os.path.join(OUT, "vocab.json"), "w") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(OUT, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    config = {
        "tokenizer_class": "CLIPTokenizer", "model_max_length": MAX_LENGTH, "do_lower_case": True,
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "errors": "replace", "add_prefix_space": False,
    }
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)

    tok = AutoTokenizer.from_pretrained(OUT)
    texts = [
        "a photo of a cat",
        "A PHOTO of a Cat!!",
        "hello world's red dog, isn't it?",
        "  two\tspaced \n\n lines  ",
        "numbers 12345 and 3.14",
        "caf\u00e9 vs cafe\u0301 and \u00fcber",
        "emoji \U0001F600\U0001F408 and symbols #@!$",
        "<|startoftext|>inline<|endoftext|> specials",
        "a photo of a red dog and a cat in the world on a hello",
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
        })
    result = {
        "max_length": MAX_LENGTH,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "cases": cases,
        "tokenizer": type(tok).__name__,
        "command": ".venv/bin/python nightly/reference/clip_tokenizer.py",
        "library_versions": {p: importlib.metadata.version(p) for p in ["transformers", "tokenizers"]},
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(cases[:3], ensure_ascii=False))


if __name__ == "__main__":
    main()
