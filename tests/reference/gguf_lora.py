#!/usr/bin/env python3
"""Writes PEFT LoRA adapters (tests/data/lora/*) as llama.cpp GGUF LoRA adapters, the format
llama.cpp's convert_lora_to_gguf.py writes and src/llama-adapter.cpp reads (facts from both, in the
llama-cpp-python 0.3.36 sdist): general.type "adapter", adapter.type "lora", adapter.lora.alpha
(PEFT's lora_alpha), general.architecture the base's GGUF architecture; for every targeted weight
"<its GGUF name>.lora_a" (PEFT's A [r, in], i.e. ne {in, r}) and ".lora_b" (B [out, r], ne {r, out}),
with the base converter's reorderings applied to B's rows and A's columns exactly as
convert_hf_to_gguf.py applies them to the weight (LoraTorchTensor; Qwen3.5's
_LinearAttentionVReorderBase._reorder_v_heads: V heads grouped by K head -> tiled, rows of
in_proj_qkv's V part, in_proj_z, in_proj_b / in_proj_a, columns of out_proj).

Routed experts (PEFT target_parameters on transformers 5's fused experts, ParamWrapper layout:
lora_A [E*r, in] expert-major, lora_B [out, E*r] with expert e's column k at k*E + e) become
the 3-D pairs llama.cpp's build_lora_mm_id multiplies per expert: ffn_{gate,up,down}_exps.lora_a
[E, r, in] (ne {in, r, E}) and .lora_b [E, out, r] (ne {r, out, E}); the fused gate_up's one A
serves gate and up, its B's first I rows are gate's, the next I up's (transformers' order).

  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
  /tmp/gguf-venv/bin/python tests/reference/gguf_lora.py ADAPTER_DIR BASE_CONFIG_JSON OUT.gguf

rank_pattern / alpha_pattern / use_rslora are refused (llama.cpp's format has one alpha and takes
each tensor's rank from lora_b). Only the module kinds the fixtures target are mapped.
"""
import json
import struct
import sys

import gguf
import numpy as np

ARCHS = {"qwen3_5_moe_text": "qwen35moe", "qwen3_5_moe": "qwen35moe", "qwen3_moe": "qwen3moe"}

# HF module suffix (after "layers.N.") -> GGUF tensor base (after "blk.N."), and the V-head
# reordering the converter gives the weight: ("rows", head_dim key or 1, after q/k) or ("cols", ...).
DENSE = {
    "self_attn.q_proj": ("attn_q", None),
    "self_attn.k_proj": ("attn_k", None),
    "self_attn.v_proj": ("attn_v", None),
    "self_attn.o_proj": ("attn_output", None),
    "linear_attn.in_proj_qkv": ("attn_qkv", ("rows", "linear_value_head_dim", True)),
    "linear_attn.in_proj_z": ("attn_gate", ("rows", "linear_value_head_dim", False)),
    "linear_attn.in_proj_b": ("ssm_beta", ("rows", 1, False)),
    "linear_attn.in_proj_a": ("ssm_alpha", ("rows", 1, False)),
    "linear_attn.out_proj": ("ssm_out", ("cols", "linear_value_head_dim", False)),
    "mlp.shared_expert.gate_proj": ("ffn_gate_shexp", None),
    "mlp.shared_expert.up_proj": ("ffn_up_shexp", None),
    "mlp.shared_expert.down_proj": ("ffn_down_shexp", None),
}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        dt = {"F32": np.float32, "F16": np.float16, "BF16": None}[v["dtype"]]
        a, b = v["data_offsets"]
        raw = blob[a:b]
        if dt is None:
            x = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = x.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=dt).astype(np.float32)
        out[k] = arr.reshape(v["shape"])
    return out


def reorder_v_heads(a, dim, nk, r, hd):
    """V heads grouped by K head [nk, r, hd] -> tiled [r, nk, hd] along `dim` (llama.cpp's
    _reorder_v_heads; bench/moe_to_gguf.py has the same)."""
    shape = list(a.shape)
    new = shape[:dim] + [nk, r, hd] + shape[dim + 1:]
    perm = list(range(len(new)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return np.ascontiguousarray(a.reshape(new).transpose(perm)).reshape(shape)


def main():
    adapter_dir, base_config, out_path = sys.argv[1:4]
    acfg = json.load(open(f"{adapter_dir}/adapter_config.json"))
    for k in ("rank_pattern", "alpha_pattern"):
        if acfg.get(k):
            sys.exit(f"{k} is set: llama.cpp's GGUF LoRA has one alpha and no per-module rank")
    if acfg.get("use_rslora"):
        sys.exit("use_rslora: llama.cpp scales by alpha / r")
    cfg = json.load(open(base_config))
    cfg = cfg.get("text_config", cfg) if cfg["model_type"] == "qwen3_5_moe" else cfg
    arch = ARCHS[cfg["model_type"]]
    r_cfg, alpha = acfg["r"], float(acfg["lora_alpha"])
    E = cfg.get("num_experts", cfg.get("num_local_experts"))
    nk, nv = cfg.get("linear_num_key_heads", 0), cfg.get("linear_num_value_heads", 0)
    tiled = arch == "qwen35moe" and nk and nv and nk != nv
    w = read_safetensors(f"{adapter_dir}/adapter_model.safetensors")
    pairs = {}
    for k, v in w.items():
        key = k.removeprefix("base_model.model.")
        for s in (".lora_A.weight", ".lora_B.weight"):
            if key.endswith(s):
                pairs.setdefault(key[: -len(s)], {})[s[6]] = v
    writer = gguf.GGUFWriter(out_path, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    tensors = []
    for module, ab in sorted(pairs.items()):
        A, B = ab["A"], ab["B"]
        parts = module.split(".")
        i = parts.index("layers")
        bid, suffix = int(parts[i + 1]), ".".join(parts[i + 2:])
        if suffix.startswith("mlp.experts"):
            r = A.shape[0] // E
            a = A.reshape(E, r, A.shape[1])                      # expert e's rows e*r .. e*r + r - 1
            b = B.reshape(B.shape[0], r, E).transpose(2, 0, 1)   # column k*E + e -> [E, out, r]
            hidden = cfg["hidden_size"]
            if A.shape[1] == hidden:                             # gate_up_proj [E, 2I, H]
                inter = B.shape[0] // 2
                tensors.append((f"blk.{bid}.ffn_gate_exps.weight.lora_a", a))
                tensors.append((f"blk.{bid}.ffn_gate_exps.weight.lora_b", b[:, :inter]))
                tensors.append((f"blk.{bid}.ffn_up_exps.weight.lora_a", a))
                tensors.append((f"blk.{bid}.ffn_up_exps.weight.lora_b", b[:, inter:]))
            else:                                                # down_proj [E, H, I]
                tensors.append((f"blk.{bid}.ffn_down_exps.weight.lora_a", a))
                tensors.append((f"blk.{bid}.ffn_down_exps.weight.lora_b", b))
            continue
        if suffix not in DENSE:
            sys.exit(f"{module}: not mapped by this script")
        name, reorder = DENSE[suffix]
        if reorder and tiled:
            how, hd, after_qk = reorder
            hd = cfg[hd] if isinstance(hd, str) else hd
            r = nv // nk
            if how == "rows":
                off = 2 * nk * cfg["linear_key_head_dim"] if after_qk else 0
                B = np.concatenate([B[:off], reorder_v_heads(B[off:], 0, nk, r, hd)])
            else:
                A = reorder_v_heads(A, 1, nk, r, hd)
        tensors.append((f"blk.{bid}.{name}.weight.lora_a", A))
        tensors.append((f"blk.{bid}.{name}.weight.lora_b", B))
    for name, t in tensors:
        writer.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out_path}: {len(tensors)} tensors, arch {arch}, alpha {alpha}, r {r_cfg}")


if __name__ == "__main__":
    main()
