"""Writes SmolLM2-135M-Instruct as the pre-quantized checkpoints people download: W4A16 and
W8A16 (compressed-tensors, as llm-compressor saves them) and FP8 with 128x128 blocks
(transformers' `fp8` format, as DeepSeek's and Qwen's FP8 releases).

The source is the bf16 cast of the f32 folder transformers writes from the shipped GGUF
(`ZOO_SMOLLM2_F32_DIR`, from scripts/fetch-test-assets.sh --bench); the quantizers are the
reference generator's (`nightly/reference/compressed.py` and `fp8.py`: min-max scales, the
libraries' own packing). `lm_head` is tied to the embedding, which stays bf16. The weights
pass through Q4_1 on the way, so these folders are for timing, not quality.

Usage: prequantize.py --write DIR  (writes DIR/w4a16, DIR/w8a16 and DIR/fp8)
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nightly" / "reference"))
import compressed  # noqa: E402
import fp8  # noqa: E402
from compressed_tensors.compressors import ModelCompressor  # noqa: E402

SCHEMES = {
    "w4a16": dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32),
    "w8a16": dict(num_bits=8, type="int", symmetric=True, strategy="channel"),
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


def write_compressed(src: Path, dst: Path, weights: dict) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    spec = compressed.CompressedSpec(dst.name, None, "", [], weights, "pack-quantized")
    compressed._quantize(model, spec)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(dst)
    compressor.update_config(dst)


def write_fp8(src: Path, dst: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model.save_pretrained(dst)
    tensors = {}
    for file in dst.glob("*.safetensors"):
        tensors.update(load_file(file))
        file.unlink()
    for name in list(tensors):
        if name.endswith("proj.weight"):
            tensors[name], tensors[f"{name}_scale_inv"] = fp8._quantize(tensors[name], [128, 128])
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [128, 128]}
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", required=True, type=Path)
    args = parser.parse_args()
    src = Path(os.environ.get("ZOO_SMOLLM2_F32_DIR", ""))
    if not (src / "config.json").exists():
        raise SystemExit("ZOO_SMOLLM2_F32_DIR is not an HF folder: run through scripts/bench.sh, which writes it")
    for name, weights in SCHEMES.items():
        (args.write / name).mkdir(parents=True)
        write_compressed(src, args.write / name, weights)
        copy_tokenizer(src, args.write / name)
    (args.write / "fp8").mkdir(parents=True)
    write_fp8(src, args.write / "fp8")
    copy_tokenizer(src, args.write / "fp8")


if __name__ == "__main__":
    main()
