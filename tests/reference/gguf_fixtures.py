#!/usr/bin/env python3
"""Writes the GGUF test fixtures of tests/data/gguf/ with the `gguf` PyPI package (llama.cpp's
gguf-py), run ONCE by a developer; ctest reads the committed outputs and needs no Python.

  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
  /tmp/gguf-venv/bin/python tests/reference/gguf_fixtures.py tests/data/gguf
  xz -9 -f tests/data/gguf/blocks.gguf

Files:
  blocks.gguf   one tensor `w.TYPE` [4 rows x 512 cols] per block type spool supports, and
                `ref.TYPE` (F32): gguf.quants.dequantize of it, the reference values. Types the
                package can quantize (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) hold
                quantized random weights; the others (K-quants, IQ4_NL, IQ4_XS) random valid
                blocks (random bytes, finite random f16 scales). Metadata: one key of every
                value type and arrays of each element type (`test.*`).
  align64.gguf  general.alignment = 64, tensors of odd sizes (padding between them).
  split-0000N-of-00003.gguf  a split set of 5 tensors, at most 2 per shard.
"""
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

ROWS, COLS = 4, 512
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
         "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
# Byte offsets of the f16 scale fields inside one block, for random blocks.
HALF_FIELDS = {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
               "IQ4_NL": [0], "IQ4_XS": [0]}


def weights(rng, shape):
    w = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    w.flat[rng.integers(0, w.size, size=8)] *= 25.0  # a few outliers, as in real weights
    return w


def random_blocks(rng, qtype, name):
    blck, size = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = ROWS * COLS // blck
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in HALF_FIELDS[name]:
        d = rng.normal(0.0, 0.01, size=nblocks).astype(np.float16)
        d[0] = np.float16(6.0e-8)  # a subnormal half
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(ROWS, COLS // blck * size)


def write_blocks(out: Path):
    rng = np.random.default_rng(20240914)
    w = gguf.GGUFWriter(str(out / "blocks.gguf"), "spool-test")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.125)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo GGUF")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -2.5e-300)
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_key_value("test.arr_u8", [1, 2, 250], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8)
    w.add_array("test.arr_f32", [0.5, -1.5])
    w.add_array("test.arr_str", ["a", "", "ccc"])
    w.add_array("test.arr_bool", [True, False])
    w.add_string("test.gguf_package", "gguf " + getattr(gguf, "__version__", "0.19.0"))
    for name in TYPES:
        qt = QT[name]
        if name in HALF_FIELDS:
            data = random_blocks(rng, qt, name)
        else:
            data = gguf.quants.quantize(weights(rng, (ROWS, COLS)), qt)
        ref = gguf.quants.dequantize(data, qt).astype(np.float32)
        assert ref.shape == (ROWS, COLS), (name, ref.shape)
        w.add_tensor("w." + name, data, raw_dtype=qt)  # quantized: the byte shape, converted by the writer
        w.add_tensor("ref." + name, ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_align64(out: Path):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(out / "align64.gguf"), "spool-test")
    w.add_custom_alignment(64)
    w.add_tensor("a", rng.normal(size=(3, 5)).astype(np.float32))  # 60 bytes: padded to 64
    q = gguf.quants.quantize(weights(rng, (2, 64)), QT.Q8_0)
    w.add_tensor("b", q, raw_dtype=QT.Q8_0)  # 136 bytes
    w.add_tensor("c", rng.normal(size=(7,)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_split(out: Path):
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(str(out / "split.gguf"), "spool-test", split_max_tensors=2)
    w.add_string("general.name", "split test")
    for i in range(5):
        w.add_tensor(f"t{i}", np.full((2, 3 + i), float(i), dtype=np.float32) + rng.normal(size=(2, 3 + i)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_blocks(out)
    write_align64(out)
    write_split(out)


if __name__ == "__main__":
    main()
