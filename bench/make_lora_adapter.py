#!/usr/bin/env python3
"""Writes a random PEFT LoRA adapter for a spool benchmark (bench/lora.sh): adapter_config.json and
adapter_model.safetensors (F32) in OUT, sized for the base checkpoint BASE (a Hugging Face layout:
config.json and *.safetensors, whose headers give each targeted matrix's shape and name).

  make_lora_adapter.py BASE OUT [--rank 16] [--alpha 32] [--seed 0] [--no-experts] [--no-shared]

Targets (PEFT 0.21 names and layouts, as src/lora/adapter.h reads them):
  target_modules     the attention projections (self_attn.q_proj / k_proj / v_proj / o_proj), the Gated
                     DeltaNet projections (linear_attn.in_proj_qkv / in_proj_z / out_proj) and the shared
                     expert (mlp.shared_expert.gate_proj / up_proj / down_proj) wherever the base has them:
                     lora_A [r, in], lora_B [out, r] per matrix;
  target_parameters  mlp.experts.gate_up_proj and mlp.experts.down_proj (the routed experts' 3-D tensors)
                     wrapped by PEFT's ParamWrapper: gate_up_proj as "<experts>.base_layer" with lora_A
                     [E*r, hidden], lora_B [2*moe_intermediate, E*r]; down_proj as "<experts>" with
                     lora_A [E*r, moe_intermediate], lora_B [hidden, E*r].
Values: random, small (|x| in [2^-7, 2^-5), random sign), enough for a speed test; the adapter is not
trained. Needs only the Python standard library: the safetensors file is written by hand (8-byte
little-endian header length, JSON header, raw little-endian f32 data).
"""
import argparse
import glob
import json
import os
import random
import struct
import sys

DENSE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "linear_attn.in_proj_qkv",
         "linear_attn.in_proj_z", "linear_attn.out_proj")
SHARED = ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")


def base_tensors(base):
    """name -> shape of every tensor in BASE's *.safetensors headers."""
    shapes = {}
    files = sorted(glob.glob(os.path.join(base, "*.safetensors")))
    if not files:
        sys.exit(f"make_lora_adapter.py: no *.safetensors in {base}")
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                shapes[k] = v["shape"]
    return shapes


def random_f32(rng, n):
    """n random f32 values, |x| in [2^-7, 2^-5) with a random sign, as little-endian bytes.

    Random bytes with each float's top byte set to sign | 0x3C (biased exponent 120 or 121 with the
    next byte's top bit): no NaN, infinity or denormal, and generated at C speed.
    """
    buf = bytearray(rng.randbytes(4 * n))
    top = bytes((x & 0x80) | 0x3C for x in range(256))
    buf[3::4] = bytes(buf[3::4]).translate(top)
    return buf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-experts", action="store_true", help="no target_parameters (routed experts)")
    ap.add_argument("--no-shared", action="store_true", help="no shared-expert target_modules")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.base, "config.json")))
    cfg = cfg.get("text_config", cfg)
    shapes = base_tensors(a.base)
    r = a.rank
    rng = random.Random(a.seed)
    tensors = []  # (key, shape)
    modules = set()
    targets = DENSE + (() if a.no_shared else SHARED)
    for name in sorted(shapes):
        for t in targets:
            if name.endswith("." + t + ".weight") and len(shapes[name]) == 2:
                module = name[: -len(".weight")]
                out_f, in_f = shapes[name]
                tensors.append((f"base_model.model.{module}.lora_A.weight", [r, in_f]))
                tensors.append((f"base_model.model.{module}.lora_B.weight", [out_f, r]))
                modules.add(t.split(".")[-1] if not t.startswith("mlp.") else t[4:])
    params = []
    if not a.no_experts:
        E, H, I = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
        # Each MoE layer's experts module: named as the base names its layers (any prefix).
        layers = sorted({n.split(".mlp.experts.")[0] for n in shapes if ".mlp.experts." in n},
                        key=lambda p: int(p.rsplit(".", 1)[1]))
        if not layers:
            sys.exit(f"make_lora_adapter.py: {a.base} has no mlp.experts tensors")
        for layer in layers:
            m = f"base_model.model.{layer}.mlp.experts"
            tensors.append((f"{m}.base_layer.lora_A.weight", [E * r, H]))      # gate_up_proj
            tensors.append((f"{m}.base_layer.lora_B.weight", [2 * I, E * r]))
            tensors.append((f"{m}.lora_A.weight", [E * r, I]))                 # down_proj
            tensors.append((f"{m}.lora_B.weight", [H, E * r]))
        params = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    if not tensors:
        sys.exit(f"make_lora_adapter.py: nothing in {a.base} to target")
    os.makedirs(a.out, exist_ok=True)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for key, shape in tensors:
        n = shape[0] * shape[1] * 4
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)  # data 8-byte aligned
    with open(os.path.join(a.out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, shape in tensors:
            f.write(random_f32(rng, shape[0] * shape[1]))
    config = {"peft_type": "LORA", "r": r, "lora_alpha": a.alpha, "use_rslora": False, "use_dora": False,
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
              "rank_pattern": {}, "alpha_pattern": {}, "target_modules": sorted(modules),
              "target_parameters": params, "base_model_name_or_path": os.path.basename(os.path.normpath(a.base)),
              "inference_mode": True}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{a.out}: rank {r}, alpha {a.alpha:g}, {len(tensors) // 2} A/B pairs "
          f"({len(modules)} module kinds{', routed experts' if params else ''}), {off / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
