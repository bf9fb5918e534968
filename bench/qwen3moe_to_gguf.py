#!/usr/bin/env python3
"""Writes a qwen3_moe safetensors checkpoint (Hugging Face layout, BF16, per-expert tensors) as
a BF16 GGUF for llama.cpp's `qwen3moe` architecture, with the `gguf` package (llama.cpp's
gguf-py). Used by bench/compare.sh so that llama.cpp and spool run the same weights; the
vocabulary is written as `none` with vocab_size dummy tokens (llama-bench feeds random ids).

  python3 bench/qwen3moe_to_gguf.py MODEL_DIR OUT.gguf
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("model_type") != "qwen3_moe":
        sys.exit(f"{src}: model_type {cfg.get('model_type')!r}, this writer handles qwen3_moe only")
    idx_path = src / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx_path.read_text())["weight_map"].values())) if idx_path.exists() else ["model.safetensors"]

    # Tensor table of every shard: name -> (file, dtype, shape, absolute offset).
    table = {}
    for f in files:
        with open(src / f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            if t["dtype"] != "BF16":
                sys.exit(f"{f}: {name} is {t['dtype']}; this writer expects BF16")
            table[name] = (src / f, t["shape"], 8 + n + t["data_offsets"][0])

    maps = {}

    def load(name):
        path, shape, off = table[name]
        if path not in maps:
            maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        count = int(np.prod(shape))
        return maps[path][off:off + 2 * count].view(np.uint16).reshape(shape)

    L, E = cfg["num_hidden_layers"], cfg["num_experts"]
    H, I = cfg["hidden_size"], cfg["moe_intermediate_size"]
    w = gguf.GGUFWriter(str(out), "qwen3moe")
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg.get("intermediate_size", I))
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(I)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_tokenizer_model("none")
    w.add_vocab_size(cfg["vocab_size"])

    # (gguf name, producer of a uint16 array in PyTorch order)
    plan = [("token_embd.weight", lambda: load("model.embed_tokens.weight")),
            ("output_norm.weight", lambda: load("model.norm.weight")),
            ("output.weight", lambda: load("lm_head.weight"))]
    per_layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
                 "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate_inp": "mlp.gate"}
    for b in range(L):
        for g, h in per_layer.items():
            plan.append((f"blk.{b}.{g}.weight", lambda b=b, h=h: load(f"model.layers.{b}.{h}.weight")))
        for g, h in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
            plan.append((f"blk.{b}.{g}.weight",
                         lambda b=b, h=h: np.stack([load(f"model.layers.{b}.mlp.experts.{e}.{h}.weight") for e in range(E)])))

    # Tensor infos first (shapes without loading the experts), then the data one tensor at a time.
    def shape_of(name, make):
        if "_exps" in name:
            b, h = name.split(".")[1], {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}[name.split(".")[2]]
            return [E] + table[f"model.layers.{b}.mlp.experts.0.{h}.weight"][1]
        return None

    shapes = {}
    for name, make in plan:
        s = shape_of(name, make)
        if s is None:
            s = list(make().shape)
        shapes[name] = s
        w.add_tensor_info(name, s, np.dtype(np.uint16), int(np.prod(s)) * 2, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, make in plan:
        a = np.ascontiguousarray(make())
        assert list(a.shape) == shapes[name], name
        w.write_tensor_data(a)
    w.close()
    print(f"{out}: {len(plan)} tensors")


if __name__ == "__main__":
    main()
