#!/usr/bin/env python3
"""Writes tests/data/gguf/iquants.gguf with the `gguf` PyPI package (llama.cpp's gguf-py), run ONCE
by a developer; ctest reads the committed, xz-compressed output and needs no Python.

  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
  /tmp/gguf-venv/bin/python tests/reference/gguf_iquant_fixtures.py tests/data/gguf
  xz -9e --lzma2=preset=9e,lc=2,lp=2,pb=2 -f tests/data/gguf/iquants.gguf

File: one tensor `w.TYPE` [ROWS x COLS] per i-quant / ternary block type (IQ1_S, IQ1_M, IQ2_XXS,
IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, TQ1_0, TQ2_0) and `ref.TYPE` (F32): gguf.quants.dequantize of it.
The blocks are random valid blocks: random bytes (every grid / sign index and sub-block scale the
format can hold; block 2 all 0xFF bytes, block 3 all zero: every field at its largest value and at
zero), with the f16 super-block scale d replaced by a finite random half (block 0: a subnormal,
block 1: -3). The package cannot quantize these types, so random blocks are the only way to write
them; every bit pattern of the other fields is a valid block.
"""
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

ROWS, COLS = 4, 6144  # 96 blocks of 256 elements per type
TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0"]
# Byte offset of the f16 d inside one block (IQ1_M: split over the top nibbles of 4 u16 words at 48).
HALF_FIELD = {"IQ1_S": 0, "IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "TQ1_0": 52, "TQ2_0": 64}


def random_blocks(rng, name):
    qt = QT[name]
    blck, size = gguf.GGML_QUANT_SIZES[qt]
    nblocks = ROWS * COLS // blck
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    raw[2, :] = 0xFF  # every index, sign and scale field at its largest value
    raw[3, :] = 0x00  # ... and at zero
    d = rng.normal(0.0, 0.01, size=nblocks).astype(np.float16)
    d[0] = np.float16(6.0e-8)  # a subnormal half
    d[1] = np.float16(-3.0)    # a large one, negative
    bits = d.view(np.uint16)
    if name == "IQ1_M":
        words = raw[:, 48:56].copy().view(np.uint16)  # [nblocks, 4]
        for w in range(4):
            words[:, w] = (words[:, w] & 0x0FFF) | (((bits >> (4 * w)) & 0xF) << 12).astype(np.uint16)
        raw[:, 48:56] = words.view(np.uint8)
    else:
        off = HALF_FIELD[name]
        raw[:, off:off + 2] = bits.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(ROWS, COLS // blck * size)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261206)
    w = gguf.GGUFWriter(str(out / "iquants.gguf"), "spool-test")
    w.add_string("test.gguf_package", "gguf " + getattr(gguf, "__version__", "0.19.0"))
    for name in TYPES:
        qt = QT[name]
        data = random_blocks(rng, name)
        ref = gguf.quants.dequantize(data, qt).astype(np.float32)
        assert ref.shape == (ROWS, COLS), (name, ref.shape)
        assert np.isfinite(ref).all(), name
        w.add_tensor("w." + name, data, raw_dtype=qt)
        w.add_tensor("ref." + name, ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
