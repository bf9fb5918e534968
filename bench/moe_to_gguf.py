#!/usr/bin/env python3
"""Writes a BF16 Hugging Face MoE checkpoint (safetensors, per-expert or fused experts) as a GGUF for
llama.cpp, with the `gguf` package (llama.cpp's gguf-py): qwen3_moe -> `qwen3moe`,
qwen3_5_moe(_text) -> `qwen35moe`. Used by bench/compare.sh so that llama.cpp and spool run
the same weights. Matrices stay BF16; norms, conv1d, A and dt biases are F32 (as llama.cpp's
own converter writes them, with the same value transforms: 1 + w norms, A = -exp(A_log), V heads
reordered to llama.cpp's tiled order). Without --vocab the vocabulary is written as `none` with
vocab_size dummy tokens (llama-bench feeds random token ids); with --vocab the directory's
tokenizer.json / tokenizer_config.json / chat_template.jinja are written as llama.cpp's converter
writes a byte-level BPE vocabulary (add_hf_vocab), so llama-perplexity and `spool generate` can
tokenize text with the file alone.

  python3 bench/moe_to_gguf.py MODEL_DIR OUT.gguf [--vocab]
"""
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf


def bf16_to_f32(a):
    return (a.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def reorder_v_heads(a, dim, nk, r, hd):
    """V heads grouped by K head [nk, r, hd] -> tiled [r, nk, hd] along `dim`."""
    shape = list(a.shape)
    new = shape[:dim] + [nk, r, hd] + shape[dim + 1:]
    perm = list(range(len(new)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return np.ascontiguousarray(a.reshape(new).transpose(perm)).reshape(shape)


def looks_special(t):
    """llama.cpp's convert_hf_to_gguf does_token_look_special (facts only: which added tokens it
    marks CONTROL although Hugging Face has special=false)."""
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<\uff5c") and t.endswith("\uff5c>")) or (t.startswith("<unused") and t.endswith(">")))


def add_hf_vocab(w, tok_json, tok_config, vocab_size, chat_template=None, config=None):
    """Writes a Hugging Face byte-level BPE tokenizer (the parsed tokenizer.json and the text of
    tokenizer_config.json) as llama.cpp's converter does (get_vocab_base + SpecialVocab): model
    `gpt2`, `pre` qwen2 or qwen35 (from the Split regex), one token per id in [0, vocab_size)
    (`[PADi]` UNUSED for the ids without one), added tokens CONTROL when special or
    looks_special, else USER_DEFINED, merges, special ids, add_bos_token, chat template."""
    vocab = dict(tok_json["model"]["vocab"])
    added = {a["id"]: a for a in tok_json.get("added_tokens", [])}
    for i, a in added.items():
        vocab[a["content"]] = i
    rev = {i: t for t, i in vocab.items()}
    assert max(rev) < vocab_size, (max(rev), vocab_size)
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            t = added[i]["content"]
            types.append(gguf.TokenType.CONTROL if added[i]["special"] or looks_special(t) else gguf.TokenType.USER_DEFINED)
            tokens.append(t)
        else:
            tokens.append(rev[i])
            types.append(gguf.TokenType.NORMAL)
    regex = json.dumps(tok_json.get("pre_tokenizer"))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35" if "p{M}" in regex else "qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    d = Path(tempfile.mkdtemp())
    try:  # gguf.SpecialVocab reads merges, special ids and the template from files
        (d / "tokenizer.json").write_text(json.dumps(tok_json))
        (d / "tokenizer_config.json").write_text(tok_config)
        if chat_template is not None:
            (d / "chat_template.jinja").write_text(chat_template)
        if config is not None:
            (d / "config.json").write_text(json.dumps(config))
        gguf.SpecialVocab(d, load_merges=True, n_vocab=vocab_size).add_to_gguf(w, quiet=True)
    finally:
        shutil.rmtree(d)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--vocab"]
    with_vocab = "--vocab" in sys.argv[1:]
    src, out = Path(args[0]), Path(args[1])
    raw = json.loads((src / "config.json").read_text())
    cfg = {**raw, **raw.get("text_config", {})}
    mt = cfg.get("model_type")
    arch = {"qwen3_moe": "qwen3moe", "qwen3_5_moe": "qwen35moe", "qwen3_5_moe_text": "qwen35moe"}.get(mt)
    if arch is None:
        sys.exit(f"{src}: model_type {mt!r}: this writer handles qwen3_moe and qwen3_5_moe")
    idx_path = src / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx_path.read_text())["weight_map"].values())) if idx_path.exists() else ["model.safetensors"]

    table = {}  # normalised name -> (file, shape, absolute offset)
    for f in files:
        with open(src / f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            if t["dtype"] != "BF16":
                sys.exit(f"{f}: {name} is {t['dtype']}; this writer expects BF16")
            for p in ("model.language_model.", "model."):
                if name.startswith(p):
                    name = name[len(p):]
                    break
            table[name] = (src / f, t["shape"], 8 + n + t["data_offsets"][0])

    maps = {}

    def load(name):
        path, shape, off = table[name]
        if path not in maps:
            maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        return maps[path][off:off + 2 * int(np.prod(shape))].view(np.uint16).reshape(shape)

    L, E = cfg["num_hidden_layers"], cfg["num_experts"]
    H, I, hd = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["head_dim"]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg.get("intermediate_size", I))
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    rope = cfg.get("rope_parameters", {})
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 1e6)))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(I)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    if with_vocab:
        jinja = src / "chat_template.jinja"
        add_hf_vocab(w, json.loads((src / "tokenizer.json").read_text()), (src / "tokenizer_config.json").read_text(),
                     cfg["vocab_size"], jinja.read_text() if jinja.exists() else None, raw)
    else:
        w.add_tokenizer_model("none")
    w.add_vocab_size(cfg["vocab_size"])
    hybrid = arch == "qwen35moe"
    if hybrid:
        nk, nv, dk, dv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        r = nv // nk
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
        w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
        w.add_ssm_state_size(dk)
        w.add_ssm_group_count(nk)
        w.add_ssm_time_step_rank(nv)
        w.add_ssm_inner_size(dv * nv)
        w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
        w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))))
        w.add_rope_dimension_sections(list(rope.get("mrope_section", [11, 11, 10])) + [0] * (4 - len(rope.get("mrope_section", [11, 11, 10]))))

    # Each entry: (gguf name, shape, "bf16"|"f32", producer of the array in PyTorch order).
    plan = []

    def add(gname, hname, kind="bf16", fn=None):
        shape = list(table[hname][1])
        def make(hname=hname, fn=fn, kind=kind):
            a = load(hname)
            if kind == "f32" or fn is not None:
                a = bf16_to_f32(a)
                if fn is not None:
                    a = fn(a)
                a = a if kind == "f32" else f32_to_bf16(a)
            return a
        if fn is not None:
            shape = list(make().shape)
        plan.append((gname, shape, kind, make))

    plus1 = (lambda a: a + 1.0) if hybrid else None
    add("token_embd.weight", "embed_tokens.weight")
    add("output_norm.weight", "norm.weight", "f32", plus1)
    add("output.weight", "lm_head.weight")
    for b in range(L):
        p = f"layers.{b}."
        add(f"blk.{b}.attn_norm.weight", p + "input_layernorm.weight", "f32", plus1)
        add(f"blk.{b}.{'post_attention_norm' if hybrid else 'ffn_norm'}.weight", p + "post_attention_layernorm.weight", "f32", plus1)
        if p + "self_attn.q_proj.weight" in table:
            for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
                add(f"blk.{b}.{g}.weight", p + f"self_attn.{h}.weight")
            add(f"blk.{b}.attn_q_norm.weight", p + "self_attn.q_norm.weight", "f32", plus1)
            add(f"blk.{b}.attn_k_norm.weight", p + "self_attn.k_norm.weight", "f32", plus1)
        else:
            la = p + "linear_attn."
            qk = 2 * nk * dk
            add(f"blk.{b}.attn_qkv.weight", la + "in_proj_qkv.weight", "bf16",
                lambda a: np.concatenate([a[:qk], reorder_v_heads(a[qk:], 0, nk, r, dv)]))
            add(f"blk.{b}.attn_gate.weight", la + "in_proj_z.weight", "bf16", lambda a: reorder_v_heads(a, 0, nk, r, dv))
            add(f"blk.{b}.ssm_beta.weight", la + "in_proj_b.weight", "bf16", lambda a: reorder_v_heads(a, 0, nk, r, 1))
            add(f"blk.{b}.ssm_alpha.weight", la + "in_proj_a.weight", "bf16", lambda a: reorder_v_heads(a, 0, nk, r, 1))
            add(f"blk.{b}.ssm_out.weight", la + "out_proj.weight", "bf16", lambda a: reorder_v_heads(a, 1, nk, r, dv))
            add(f"blk.{b}.ssm_conv1d.weight", la + "conv1d.weight", "f32",
                lambda a: (lambda c: np.concatenate([c[:qk], reorder_v_heads(c[qk:], 0, nk, r, dv)]))(a.reshape(a.shape[0], -1)))
            add(f"blk.{b}.ssm_a", la + "A_log", "f32",
                lambda a: reorder_v_heads(-np.exp(a)[:, None], 0, nk, r, 1)[:, 0])
            add(f"blk.{b}.ssm_dt.bias", la + "dt_bias", "f32", lambda a: reorder_v_heads(a[:, None], 0, nk, r, 1)[:, 0])
            add(f"blk.{b}.ssm_norm.weight", la + "norm.weight", "f32")
        add(f"blk.{b}.ffn_gate_inp.weight", p + "mlp.gate.weight")
        if hybrid:
            for g, h in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"), ("ffn_down_shexp", "down_proj")):
                add(f"blk.{b}.{g}.weight", p + f"mlp.shared_expert.{h}.weight")
            add(f"blk.{b}.ffn_gate_inp_shexp.weight", p + "mlp.shared_expert_gate.weight", "f32", lambda a: a.reshape(-1))
        fused = next((p + n for n in ("mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj.weight") if p + n in table), None)
        if fused is not None:  # [E, 2I, H] (gate rows, then up rows) and [E, H, I]
            down = next(p + n for n in ("mlp.experts.down_proj", "mlp.experts.down_proj.weight") if p + n in table)
            plan.append((f"blk.{b}.ffn_gate_exps.weight", [E, I, H], "bf16", lambda f=fused: load(f)[:, :I, :]))
            plan.append((f"blk.{b}.ffn_up_exps.weight", [E, I, H], "bf16", lambda f=fused: load(f)[:, I:, :]))
            plan.append((f"blk.{b}.ffn_down_exps.weight", list(table[down][1]), "bf16", lambda d=down: load(d)))
            continue
        for g, h in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
            first = p + f"mlp.experts.0.{h}.weight"
            plan.append((f"blk.{b}.{g}.weight", [E] + list(table[first][1]), "bf16",
                         lambda p=p, h=h: np.stack([load(p + f"mlp.experts.{e}.{h}.weight") for e in range(E)])))

    for name, shape, kind, _ in plan:
        if kind == "f32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4, raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.uint16), int(np.prod(shape)) * 2, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind, make in plan:
        a = np.ascontiguousarray(make())
        assert list(a.shape) == shape, (name, a.shape, shape)
        w.write_tensor_data(a)
    w.close()
    print(f"{out}: {arch}, {len(plan)} tensors")


if __name__ == "__main__":
    main()
