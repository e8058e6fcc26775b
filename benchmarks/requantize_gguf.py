"""Writes SmolLM2-135M-Instruct in the legacy GGUF block types the shipped file lacks.

The shipped file (`ZOO_SMOLLM2_GGUF`, from scripts/fetch-test-assets.sh) stores its
matrices as Q4_1 and its embedding as Q8_0. The `quants` benchmark times zoo and llama.cpp
on the same file for each block type, so this script dequantizes every Q4_1 matrix and
quantizes it again as Q4_0, Q5_0, Q5_1 and Q8_0 with gguf-py (the reference quantizers of
llama.cpp's Python package), one file per type, with the metadata copied and
`general.file_type` set to match. The embedding and the norms stay as stored.

The weights pass through Q4_1 on the way, so these files are for timing, not quality.

Usage: requantize_gguf.py --write DIR [--from FILE]
"""

import argparse
import os
import sys

import gguf
import numpy as np

# llama.cpp's `llama_ftype` of a file whose matrices are mostly of that type.
TYPES = {
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, 2),
    "Q5_0": (gguf.GGMLQuantizationType.Q5_0, 8),
    "Q5_1": (gguf.GGMLQuantizationType.Q5_1, 9),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, 7),
}
SOURCE_TYPE = gguf.GGMLQuantizationType.Q4_1


def requantize(reader: gguf.GGUFReader, path: str, qtype, ftype: int) -> None:
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(path, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF header fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = ftype if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for t in reader.tensors:
        if t.tensor_type == SOURCE_TYPE:
            values = gguf.quants.dequantize(t.data, SOURCE_TYPE).astype(np.float32)
            data = gguf.quants.quantize(values, qtype)
            writer.add_tensor(t.name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", required=True, help="folder to write the files into")
    ap.add_argument(
        "--from",
        dest="source",
        default=os.environ.get("ZOO_SMOLLM2_GGUF"),
        help="the Q4_1 SmolLM2 GGUF (default: $ZOO_SMOLLM2_GGUF)",
    )
    args = ap.parse_args()
    if not args.source:
        print("requantize_gguf.py: no source file: pass --from or set ZOO_SMOLLM2_GGUF", file=sys.stderr)
        return 2
    reader = gguf.GGUFReader(args.source)
    if not any(t.tensor_type == SOURCE_TYPE for t in reader.tensors):
        print(f"requantize_gguf.py: {args.source} has no Q4_1 matrix to requantize", file=sys.stderr)
        return 2
    os.makedirs(args.write, exist_ok=True)
    for name, (qtype, ftype) in TYPES.items():
        path = os.path.join(args.write, f"SmolLM2-135M-Instruct.{name}.gguf")
        print(f"writing {path}", file=sys.stderr)
        requantize(reader, path, qtype, ftype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
