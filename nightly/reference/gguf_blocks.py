"""Writes zoo-hub's GGUF fixtures from the `gguf` Python package (gguf-py, llama.cpp's own).

Outputs, under hub/tests/data/gguf/:
  blocks.gguf           one tensor per element type, filled with random bytes (scale fields set
                        to random finite values), written by gguf.GGUFWriter;
  blocks_expected.gguf  for each tensor of blocks.gguf, an F32 tensor of the same name holding
                        gguf.quants.dequantize of its bytes;
  metadata.gguf         a metadata value of every GGUF type, nested arrays included.

gguf-py has no dequantizer for Q8_K (llama.cpp uses it for activations only); its expected values
are computed here with numpy from ggml's block layout (block_q8_K: f32 d, int8 qs[256], int16
bsums[16]; value = d * q), and `zoo.source.Q8_K` in blocks_expected.gguf says so. Q8_1 is left
out: gguf-py neither dequantizes it nor agrees with ggml on its size (its table says 40 bytes, a
layout ggml dropped; ggml's block_q8_1 is 36), so zoo tests it by hand instead.

Run: python nightly/reference/gguf_blocks.py [out_dir]   (needs: pip install gguf numpy)
"""

import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V
from gguf.constants import GGML_QUANT_SIZES

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../hub/tests/data/gguf")
rng = np.random.default_rng(20261130)

# (type, byte offsets of the f16 scale fields inside a block)
QUANT = [
    (T.Q4_0, [0]),
    (T.Q4_1, [0, 2]),
    (T.Q5_0, [0]),
    (T.Q5_1, [0, 2]),
    (T.Q8_0, [0]),
    (T.Q2_K, [80, 82]),
    (T.Q3_K, [108]),
    (T.Q4_K, [0, 2]),
    (T.Q5_K, [0, 2]),
    (T.Q6_K, [208]),
    (T.Q8_K, []),  # f32 d at 0, set below
]
ROWS = 4
COLS = 512  # two K-quant super-blocks, sixteen 32-element blocks per row


def finite_f16(n):
    """Random f16 bit patterns over the whole finite range (subnormals, zero, negatives)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= 0xBFFF  # clear the top exponent bit: finite
    return bits


def quant_bytes(qtype, scale_offsets):
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in scale_offsets:
        raw[:, off:off + 2] = finite_f16(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.Q8_K:
        d = rng.standard_normal(n_blocks).astype(np.float32) * np.float32(1e-2)
        raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    return raw.reshape(ROWS, COLS // block * size)


def numpy_reference(qtype, raw):
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, size)
    if qtype == T.Q8_K:
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
    else:
        raise AssertionError(qtype)
    return (d * q).reshape(ROWS, COLS)


def main():
    os.makedirs(OUT, exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(OUT, "blocks.gguf"), arch="zoo-test")
    e = gguf.GGUFWriter(os.path.join(OUT, "blocks_expected.gguf"), arch="zoo-test")

    f32 = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    w.add_tensor("F32", f32)
    e.add_tensor("F32", gguf.quants.dequantize(f32, T.F32))

    f16 = finite_f16(ROWS * COLS).view(np.float16).reshape(ROWS, COLS)
    w.add_tensor("F16", f16)
    e.add_tensor("F16", gguf.quants.dequantize(f16, T.F16))

    bf16 = rng.integers(0, 1 << 16, size=ROWS * COLS, dtype=np.uint16)
    bf16[(bf16 & 0x7F80) == 0x7F80] &= 0xBFFF  # finite
    bf16 = bf16.view(np.uint8).reshape(ROWS, COLS * 2)
    w.add_tensor("BF16", bf16, raw_dtype=T.BF16)
    e.add_tensor("BF16", gguf.quants.dequantize(bf16, T.BF16))

    for qtype, scales in QUANT:
        raw = quant_bytes(qtype, scales)
        w.add_tensor(qtype.name, raw, raw_dtype=qtype)
        try:
            expected = gguf.quants.dequantize(raw, qtype)
            source = "gguf.quants.dequantize"
        except NotImplementedError:
            expected = numpy_reference(qtype, raw)
            source = "numpy (gguf-py has no dequantizer for this type)"
        assert expected.shape == (ROWS, COLS), (qtype, expected.shape)
        e.add_tensor(qtype.name, np.ascontiguousarray(expected, dtype=np.float32))
        e.add_string(f"zoo.source.{qtype.name}", source)

    for writer in (w, e):
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    m = gguf.GGUFWriter(os.path.join(OUT, "metadata.gguf"), arch="zoo-test")
    m.add_key_value("t.u8", 200, V.UINT8)
    m.add_key_value("t.i8", -100, V.INT8)
    m.add_key_value("t.u16", 60000, V.UINT16)
    m.add_key_value("t.i16", -30000, V.INT16)
    m.add_key_value("t.u32", 4000000000, V.UINT32)
    m.add_key_value("t.i32", -2000000000, V.INT32)
    m.add_key_value("t.u64", 18000000000000000000, V.UINT64)
    m.add_key_value("t.i64", -9000000000000000000, V.INT64)
    m.add_key_value("t.f32", 1e-5, V.FLOAT32)
    m.add_key_value("t.f64", -2.5e300, V.FLOAT64)
    m.add_key_value("t.bool", True, V.BOOL)
    m.add_key_value("t.string", "h\u00e9llo \U0001F600 <|im_start|>", V.STRING)
    m.add_key_value("t.arr_i32", [1, -2, 3], V.ARRAY, sub_type=V.INT32)
    m.add_key_value("t.arr_f32", [0.5, -1.25], V.ARRAY, sub_type=V.FLOAT32)
    m.add_key_value("t.arr_str", ["a", "", "\u00fc"], V.ARRAY, sub_type=V.STRING)
    m.add_key_value("t.arr_bool", [True, False], V.ARRAY, sub_type=V.BOOL)
    m.add_key_value("t.arr_u8", [0, 255], V.ARRAY, sub_type=V.UINT8)
    m.add_key_value("t.nested", [["x", "y"], ["z"]], V.ARRAY, sub_type=V.ARRAY)
    m.add_custom_alignment(64)
    m.add_tensor("t", np.arange(8, dtype=np.float32))
    m.write_header_to_file()
    m.write_kv_data_to_file()
    m.write_tensors_to_file()
    m.close()


if __name__ == "__main__":
    main()
