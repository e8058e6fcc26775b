"""Writes hub/tests/data/gguf/tiny_llama.gguf, a small random llama-architecture GGUF written by
gguf-py's GGUFWriter, and tiny_llama_reference.json: what transformers makes of it.

It also writes tiny_spm.gguf, a llama GGUF without tensors whose tokenizer is SentencePiece BPE
(`tokenizer.ggml.model` = "llama": scores and byte tokens, no merges, a user-defined token), and
puts transformers' ids for it under "spm" in the same JSON.

The llama file covers what the SmolLM2 file does not: an untied `output.weight`, grouped-query attention with
every quantized type among the weights, linear rope scaling, a llama-3 style tokenizer
(`tokenizer.ggml.pre` = "llama-bpe", BOS added, a user-defined token), and numbers that the
llama-3 split cuts in groups of three.

Run: .venv/bin/python nightly/reference/gguf_tiny_llama.py   (needs torch, transformers, gguf, numpy)
"""

import json
import os

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, get_gguf_hf_weights_map

OUT = os.path.join(os.path.dirname(__file__), "../../hub/tests/data/gguf")
rng = np.random.default_rng(7)

HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 256, 4, 2, 256, 2
HEAD_DIM = HIDDEN // HEADS

# Byte-level vocabulary: the 256 byte symbols, the tokens the merges build, then specials.
BYTES = list(bytes_to_unicode().values())
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ t", "Ġt h", "Ġth e", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "1 2", "12 3", "Ġ Ġ"]
MERGED = [m.replace(" ", "") for m in MERGES]
SPECIALS = [("<|begin_of_text|>", 3), ("<|end_of_text|>", 3), ("<|eot_id|>", 3), ("<think>", 4), ("</think>", 4)]
TOKENS = BYTES + MERGED + [s for s, _ in SPECIALS]
TYPES = [1] * (len(BYTES) + len(MERGED)) + [t for _, t in SPECIALS]
VOCAB = len(TOKENS)
BOS, EOS = TOKENS.index("<|begin_of_text|>"), TOKENS.index("<|eot_id|>")

STRINGS = [
    "hello world",
    "hello the world",
    "1234567 and 123 and 12",
    "  two spaces then hello",
    "<think>hmm</think> hello",
    "<|eot_id|>hello<|end_of_text|>",
    "Caf\u00e9 \U0001F600 \u65e5\u672c",
    "line\nbreak\r\nand\ttab",
    "it's THE world's",
    "",
]


def finite_f16(n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF
    # Small scales keep the random weights in a sane range.
    bits = (bits & 0x83FF) | 0x1C00
    return bits


SCALES = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82],
          T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def tensor(w, name, rows, cols, qtype):
    if qtype == T.F32:
        w.add_tensor(name, rng.standard_normal((rows, cols)).astype(np.float32) if rows > 1 else rng.standard_normal(cols).astype(np.float32))
        return
    if qtype == T.F16:
        w.add_tensor(name, rng.standard_normal(cols).astype(np.float16))
        return
    if qtype == T.BF16:
        x = rng.standard_normal(cols).astype(np.float32).view(np.uint32) >> 16
        w.add_tensor(name, x.astype(np.uint16).view(np.uint8), raw_dtype=T.BF16)
        return
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in SCALES[qtype]:
        raw[:, off:off + 2] = finite_f16(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    w.add_tensor(name, raw.reshape(rows, cols // block * size), raw_dtype=qtype)


def write(path):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("zoo tiny llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_add_bos_token(True)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m['content'] }}<|eot_id|>{% endfor %}")

    tensor(w, "token_embd.weight", VOCAB, HIDDEN, T.Q8_0)
    types = [
        {"attn_q": T.Q4_K, "attn_k": T.Q5_K, "attn_v": T.Q3_K, "attn_output": T.Q2_K,
         "ffn_gate": T.Q5_0, "ffn_up": T.Q5_1, "ffn_down": T.Q4_0},
        {"attn_q": T.Q8_0, "attn_k": T.Q4_1, "attn_v": T.Q6_K, "attn_output": T.Q4_K,
         "ffn_gate": T.Q2_K, "ffn_up": T.Q3_K, "ffn_down": T.Q5_K},
    ]
    norm_types = [(T.F32, T.F32), (T.BF16, T.F16)]
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FF, HIDDEN), "ffn_up": (FF, HIDDEN), "ffn_down": (HIDDEN, FF)}
    for i in range(LAYERS):
        tensor(w, f"blk.{i}.attn_norm.weight", 1, HIDDEN, norm_types[i][0])
        for name, qtype in types[i].items():
            rows, cols = shapes[name]
            tensor(w, f"blk.{i}.{name}.weight", rows, cols, qtype)
        tensor(w, f"blk.{i}.ffn_norm.weight", 1, HIDDEN, norm_types[i][1])
    tensor(w, "output_norm.weight", 1, HIDDEN, T.F32)
    tensor(w, "output.weight", VOCAB, HIDDEN, T.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def fingerprint(values):
    """As in gguf_smollm2.py: sum_i bits(v[i]) * (splitmix64(i) | 1) mod 2^64."""
    bits = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = np.arange(bits.size, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        return int(np.sum(bits * (z | np.uint64(1)), dtype=np.uint64))


SPM_STRINGS = [
    "hello world",
    " hello  the world",
    "Hello\nworld 123 \U0001F600",
    "<s>the</s> <think>and",
    "",
    "\u00e9\u65e5\u672c",
    "and in the wording",
    "   leading spaces",
    "trailing  ",
    "123123 12 1",
]


def write_spm(path):
    """A SentencePiece vocabulary as llama.cpp stores one: control/unknown tokens, the 256 byte
    tokens, then pieces with descending scores; the merges are left for the reader to recover."""
    sp = "\u2581"
    toks = [("<unk>", 2, 0.0), ("<s>", 3, 0.0), ("</s>", 3, 0.0)]
    toks += [(f"<0x{b:02X}>", 6, 0.0) for b in range(256)]
    pieces = [sp + "t", "he", sp + "the", sp + "h", "ll", sp + "he", sp + "hell", "o", sp + "hello", sp + "w",
              "or", "ld", sp + "wor", sp + "world", sp + sp, "12", "123", "in", sp + "in", "ing", sp + "a", "an",
              "and", sp + "and", "ord", "w" + "ord"]
    chars = [sp] + list("abcdefghijklmnopqrstuvwxyzHTW0123456789.,!'") + ["\u00e9", "\u65e5"]
    toks += [(p, 1, -float(i)) for i, p in enumerate(pieces)]
    toks += [(c, 1, -100.0 - i) for i, c in enumerate(chars)]
    toks.append(("<think>", 4, 0.0))
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([t for t, _, _ in toks])
    w.add_token_types([t for _, t, _ in toks])
    w.add_token_scores([s for _, _, s in toks])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    write_spm(os.path.join(OUT, "tiny_spm.gguf"))
    spm = AutoTokenizer.from_pretrained(OUT, gguf_file="tiny_spm.gguf")
    spm_json = json.loads(spm.backend_tokenizer.to_str())
    spm_out = {"cases": [{"text": s, "ids": spm(s)["input_ids"]} for s in SPM_STRINGS],
               "merges": spm_json["model"]["merges"],
               "bos_token": spm.bos_token, "eos_token": spm.eos_token, "unk_token": spm.unk_token}

    path = os.path.join(OUT, "tiny_llama.gguf")
    write(path)
    config = AutoConfig.from_pretrained(OUT, gguf_file="tiny_llama.gguf")
    cfg = config.to_dict()
    expected_config = {k: cfg[k] for k in [
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id",
        "tie_word_embeddings", "head_dim"]}
    expected_config["rope_theta"] = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    processor = LlamaTensorProcessor(config=cfg)
    name_map = get_gguf_hf_weights_map(model, processor)
    reader = gguf.GGUFReader(path)
    tensors = []
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        values = processor.process(values, t.name).weights
        tensors.append({"gguf_name": t.name, "hf_name": name_map[t.name], "type": t.tensor_type.name,
                        "hf_shape": [int(d) for d in values.shape],
                        "fingerprint": str(fingerprint(values)),
                        "first": [float(x) for x in np.asarray(values, dtype=np.float32).reshape(-1)[:4]]})

    tok = AutoTokenizer.from_pretrained(OUT, gguf_file="tiny_llama.gguf")
    cases = [{"text": s, "ids": tok(s)["input_ids"]} for s in STRINGS]
    out = {"config": expected_config, "tensors": tensors,
           "tokenizer": {"bos_token": tok.bos_token, "eos_token": tok.eos_token, "chat_template": tok.chat_template,
                         "cases": cases},
           "spm": spm_out}
    with open(os.path.join(OUT, "tiny_llama_reference.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
