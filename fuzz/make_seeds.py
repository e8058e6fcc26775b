"""Writes zoo's fuzz seed corpus, fuzz/corpus/<target>/, from real files: the test assets
(all-MiniLM-L6-v2, the SmolLM2 GGUF and its tokenizer, from scripts/fetch-test-assets.sh), the
hub's GGUF fixtures and the committed parity cases, each whole where small, else truncated to
its header, plus mutated copies (a length, a dtype, a shape, a byte flipped) so the fuzzer
starts on the error paths too. Deterministic; the corpus is committed.

Run: eval "$(scripts/fetch-test-assets.sh --bench)"; python3 fuzz/make_seeds.py
"""

import json
import os
import random
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "fuzz/corpus")
FIX = os.path.join(ROOT, "nightly/fixtures")
rng = random.Random(20261201)


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def flip(data, n=3):
    b = bytearray(data)
    for _ in range(n):
        if b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def read(path, limit=None):
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit)


shutil.rmtree(OUT, ignore_errors=True)
minilm = os.environ["ZOO_MINILM_DIR"]
gguf = os.environ["ZOO_SMOLLM2_GGUF"]
f32 = os.environ.get("ZOO_SMOLLM2_F32_DIR")

# safetensors: the header plus the first bytes of data; whole small files.
for name, path in [("minilm", os.path.join(minilm, "model.safetensors")),
                   ("bert", os.path.join(FIX, "bert-h64-f32/model.safetensors")),
                   ("gpt2_bf16", os.path.join(FIX, "gpt2-base-bf16/model.safetensors"))]:
    head = read(path, 8)
    n = struct.unpack("<Q", head)[0]
    header = read(path, 8 + n + 64)
    write("safetensors_header", f"{name}_header", header)
    hj = json.loads(header[8:8 + n])
    key = next(k for k in hj if k != "__metadata__")
    hj[key]["dtype"] = "F64"
    hj[key]["shape"] = hj[key]["shape"][::-1] + [3]
    body = json.dumps(hj).encode()
    write("safetensors_header", f"{name}_mutated", struct.pack("<Q", len(body)) + body + header[8 + n:])
    write("safetensors_header", f"{name}_flipped", flip(header[:8 + n]))
write("safetensors_header", "tiny_whole", read(os.path.join(FIX, "llama-gqa-f32/inputs.safetensors")))

# GGUF: the hub's small fixtures whole, the real SmolLM2 file truncated to its metadata.
for name in ["metadata.gguf", "tiny_spm.gguf", "blocks.gguf"]:
    write("gguf", name, read(os.path.join(ROOT, "hub/tests/data/gguf", name)))
smol = read(gguf, 48 * 1024)
write("gguf", "smollm2_head", smol)
write("gguf", "smollm2_flipped", flip(smol[:4096], 8))
write("gguf", "metadata_truncated", read(os.path.join(ROOT, "hub/tests/data/gguf/metadata.gguf"))[:300])

# model.safetensors.index.json built from a real case's tensor names.
names = sorted(json.loads(read(os.path.join(FIX, "llama-gqa-f32/model.safetensors"), 8 + struct.unpack(
    "<Q", read(os.path.join(FIX, "llama-gqa-f32/model.safetensors"), 8))[0])[8:]).keys() - {"__metadata__"})
index = {"metadata": {"total_size": 142000},
         "weight_map": {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}}
write("index_json", "two_shards.json", json.dumps(index, indent=2))
index["weight_map"][names[0]] = "../outside.safetensors"
write("index_json", "escaping_shard.json", json.dumps(index))
write("index_json", "subfolder.json", json.dumps({"weight_map": {"a": "sub/model.safetensors"}}))

# config.json / tokenizer_config.json / generation_config.json as shipped.
for case in ["llama-rope-llama3-f32", "qwen3-mqa-yarn-f32", "gpt2-base-f32", "bert-seqcls-f32", "mistral-swa-f32",
             "llama-rope-yarn-f32"]:
    write("config_json", f"{case}.json", read(os.path.join(FIX, case, "config.json")))
write("config_json", "minilm_config.json", read(os.path.join(minilm, "config.json")))
write("config_json", "minilm_tokenizer_config.json", read(os.path.join(minilm, "tokenizer_config.json")))
write("config_json", "generation_config.json", read(os.path.join(FIX, "llama-gqa-f32/generation_config.json")))


def shrink_vocab(tok, keep):
    """The same tokenizer.json with its vocabulary cut to `keep` entries (merges that need a
    dropped token go too), so a real pipeline stays a seed of a few KB."""
    model = tok["model"]
    if isinstance(model.get("vocab"), dict):
        vocab = {k: v for k, v in model["vocab"].items() if v < keep}
        model["vocab"] = vocab
        if "merges" in model:
            def parts(m):
                return m.split(" ") if isinstance(m, str) else m
            model["merges"] = [m for m in model["merges"]
                               if all(p in vocab for p in parts(m)) and "".join(parts(m)) in vocab][:200]
    tok["added_tokens"] = [t for t in tok.get("added_tokens", []) if t["id"] < keep]
    return tok


wordpiece = shrink_vocab(json.loads(read(os.path.join(minilm, "tokenizer.json"))), 1200)
write("tokenizer_json", "minilm_wordpiece.json", json.dumps(wordpiece))
write("tokenizer_json", "minilm_tokenizer_config.json", read(os.path.join(minilm, "tokenizer_config.json")))
if f32:
    bpe = shrink_vocab(json.loads(read(os.path.join(f32, "tokenizer.json"))), 600)
    write("tokenizer_json", "smollm2_bpe.json", json.dumps(bpe))
    write("tokenizer_json", "smollm2_bpe_truncated.json", json.dumps(bpe)[:3000])
    cfg = json.loads(read(os.path.join(f32, "tokenizer_config.json")))
    template = read(os.path.join(f32, "chat_template.jinja")).decode()
    cfg["chat_template"] = template
    write("tokenizer_json", "smollm2_tokenizer_config.json", json.dumps(cfg))
    write("chat_template", "smollm2.jinja", template)

# Chat templates: the real one above, and the common shapes models ship.
write("chat_template", "chatml.jinja",
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
write("chat_template", "raise.jinja",
      "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate') }}{% endif %}[INST] {{ m['content'] | trim }} [/INST]"
      "{% endfor %}{{ eos_token }}")
write("chat_template", "namespace_loop.jinja",
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }}:{{ m.content|tojson }}"
      "{% endfor %}{{ strftime_now('%Y-%m-%d') }}{% for i in range(100000) %}{% endfor %}")

# Parity cases: the fixture whose tensors the target loads, then others (mismatches).
for case in ["llama-gqa-f32", "llama-gqa-bf16", "bert-tokcls-f32", "gpt2-leftpad-f32"]:
    write("case_json", f"{case}.json", read(os.path.join(FIX, case, "case.json")))
spec = json.loads(read(os.path.join(FIX, "llama-gqa-f32/case.json")))
spec["format_version"] = 99
write("case_json", "future_version.json", json.dumps(spec))
spec["format_version"] = 1
if spec.get("outputs"):
    spec["outputs"][0]["mask"] = "no_such_input"
write("case_json", "bad_mask.json", json.dumps(spec))

# Device maps: hf_device_map shapes and a plan file's wrapper.
layers = {f"model.layers.{i}": (0 if i < 2 else 1 if i < 4 else "cpu") for i in range(6)}
write("device_map_json", "hf_device_map.json", json.dumps({"model.embed_tokens": 0, **layers, "model.norm": "disk",
                                                          "lm_head": "cuda:1"}))
write("device_map_json", "plan.json", json.dumps({"hf_device_map": layers, "devices": [{"id": 0, "bytes": 1}]}))
write("device_map_json", "bad_values.json", json.dumps({"model": -1, "lm_head": [0], "x": "tpu:z"}))
write("device_map_json", "empty_prefix.json", json.dumps({"": "cpu", "model.layers.1": 3}))
# Configs beside real weights (fuzz_targets/config_load.rs: the first byte picks the
# checkpoint, in its CHECKPOINTS order): each fixture's own config, then one with the layer
# count blown up and one with a width that disagrees with the weights.
LOADED = ["llama-gqa-f32", "gemma3-pattern-f32", "mixtral-top2-f32", "phi3-fused-f32",
          "gpt2-base-f32", "bert-base-f32", "vit-f32", "clip-text-f32", "t5-encoder-f32"]
for i, case in enumerate(LOADED):
    config = json.loads(read(os.path.join(FIX, case, "config.json")))
    write("config_load", f"{case}.json", bytes([i]) + json.dumps(config).encode())
    layers = next((k for k in ("num_hidden_layers", "num_layers", "n_layer") if k in config), None)
    if layers:
        write("config_load", f"{case}-layers.json", bytes([i]) + json.dumps({**config, layers: 1 << 31}).encode())
    width = next((k for k in ("hidden_size", "d_model", "n_embd") if k in config), None)
    if width:
        write("config_load", f"{case}-width.json", bytes([i]) + json.dumps({**config, width: 1 << 20}).encode())
total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
print(f"{OUT}: {total} bytes")
