#!/usr/bin/env python3
"""Makes the constant tensors of a `spool synth` checkpoint (norm gains 1, biases 0, sinks 0,
score-correction biases 0) random, in place, so that a GGUF conversion's handling of them is tested
(bench/gguf_agree.sh): 1-D norm gains 1 + 0.2 N, q/k/v/o and expert biases 0.1 N, e_score_correction_bias
and the router bias N (they move the routing), sinks N; seed 7. BF16 and F32 tensors; others untouched.
For presets whose stored norm is the gain itself (not 1 + w: DeepSeek, GLM-4.5, gpt-oss).

  python3 bench/perturb_synth.py MODEL_DIR
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

if len(sys.argv) != 2:
    sys.exit("usage: perturb_synth.py MODEL_DIR")
src = Path(sys.argv[1])
if not (src / "config.json").exists():
    sys.exit(f"{src}: no config.json (not a checkpoint directory)")
rng = np.random.default_rng(7)
idx = src / "model.safetensors.index.json"
files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() else ["model.safetensors"]
n_done = 0
for f in files:
    with open(src / f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
    mm = np.memmap(src / f, dtype=np.uint8, mode="r+")
    for name, t in hdr.items():
        if name == "__metadata__" or t["dtype"] not in ("BF16", "F32"):
            continue
        leaf = name.split(".")[-1]
        if "norm" in name and leaf == "weight" and len(t["shape"]) == 1:
            kind = "norm"
        elif name.endswith("e_score_correction_bias") or name.endswith("router.bias"):
            kind = "route"
        elif name.endswith("sinks"):
            kind = "sink"
        elif name.endswith(".bias") or name.endswith("_bias"):
            kind = "bias"
        else:
            continue
        shape = t["shape"]
        x = rng.standard_normal(shape).astype(np.float32)
        x = {"norm": 1 + 0.2 * x, "route": 1.0 * x, "sink": x, "bias": 0.1 * x}[kind]
        a, b = t["data_offsets"]
        if t["dtype"] == "BF16":
            u = x.view(np.uint32)
            raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        else:
            raw = x.tobytes()
        assert len(raw) == b - a
        mm[8 + n + a:8 + n + b] = np.frombuffer(raw, dtype=np.uint8)
        n_done += 1
    mm.flush()
print(f"{src}: {n_done} tensors perturbed")
