#!/usr/bin/env python3
"""Writes a BF16 Hugging Face MoE checkpoint (safetensors, per-expert or fused experts) as a GGUF for
llama.cpp, with the `gguf` package (llama.cpp's gguf-py): qwen3_moe -> `qwen3moe`,
qwen3_5_moe(_text) -> `qwen35moe`, deepseek_v3 / deepseek_v2 -> `deepseek2`, glm4_moe -> `glm4moe`,
gpt_oss -> `gpt-oss`. Used by bench/compare.sh and bench/cuda.sh so that llama.cpp and spool run
the same weights. Matrices stay BF16 (gpt-oss's MXFP4 experts stay MXFP4, their bits repacked into
ggml's block_mxfp4); norms, biases, sinks, conv1d, A and dt biases are F32, with the value transforms
of llama.cpp's own converter (convert_hf_to_gguf.py): 1 + w norms, A = -exp(A_log), V heads
reordered to llama.cpp's tiled order (Qwen3.5); MLA's kv_b_proj split per head into attn_k_b
(transposed) and attn_v_b, head_count_kv 1 (DeepSeek); gpt-oss's interleaved gate_up rows split
into ffn_gate_exps / ffn_up_exps. Multi-token-prediction (nextn) layers are not written (llama-bench
does not run them): block_count is the main stack's depth. Without --vocab the vocabulary is written as `none` with
vocab_size dummy tokens (llama-bench feeds random token ids); with --vocab the directory's
tokenizer.json / tokenizer_config.json / chat_template.jinja are written as llama.cpp's converter
writes a byte-level BPE vocabulary (add_hf_vocab), so llama-perplexity and `spool generate` can
tokenize text with the file alone.

  python3 bench/moe_to_gguf.py MODEL_DIR OUT.gguf [--vocab]

--vocab is for the qwen families (their byte-level BPE tokenizers); the other families are written
with the `none` vocabulary.
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


def mxfp4_to_ggml(blocks, scales):
    """gpt-oss MXFP4 as released -> ggml block_mxfp4 bytes. blocks [..., nb, 16] uint8 (byte k holds
    element 2k in its low nibble, element 2k + 1 in its high nibble), scales [..., nb] uint8 (E8M0)
    -> [..., nb * 17] uint8: per block the scale byte, then 16 bytes whose byte j holds element j
    (low nibble) and element j + 16 (high nibble). The 4-bit codes and the scale byte are the same
    numbers in both (ggml doubles its code table and halves the scale): only the nibbles move."""
    lo, hi = blocks & 0x0F, blocks >> 4
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)  # elements in order
    qs = (vals[..., :16] | (vals[..., 16:] << 4)).astype(np.uint8)
    out = np.concatenate([scales[..., None], qs], axis=-1)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * 17)


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


ARCHS = {"qwen3_moe": "qwen3moe", "qwen3_5_moe": "qwen35moe", "qwen3_5_moe_text": "qwen35moe",
         "deepseek_v3": "deepseek2", "deepseek_v2": "deepseek2", "glm4_moe": "glm4moe", "gpt_oss": "gpt-oss"}


class Checkpoint:
    """The safetensors tensors of a checkpoint directory, read lazily (memory-mapped): BF16 (as
    uint16), F32, U8 (MXFP4 blocks and scales). Names lose their model. / model.language_model. prefix."""

    SIZES = {"BF16": (2, np.uint16), "F32": (4, np.float32), "U8": (1, np.uint8)}

    def __init__(self, src):
        idx_path = src / "model.safetensors.index.json"
        files = sorted(set(json.loads(idx_path.read_text())["weight_map"].values())) if idx_path.exists() else ["model.safetensors"]
        self.table = {}  # name -> (file, shape, dtype, absolute offset)
        self.maps = {}
        for f in files:
            with open(src / f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                hdr = json.loads(fh.read(n))
            for name, t in hdr.items():
                if name == "__metadata__":
                    continue
                if t["dtype"] not in self.SIZES:
                    sys.exit(f"{f}: {name} is {t['dtype']}; this writer reads BF16 (and U8 MXFP4 experts, F32)")
                for p in ("model.language_model.", "model."):
                    if name.startswith(p):
                        name = name[len(p):]
                        break
                self.table[name] = (src / f, t["shape"], t["dtype"], 8 + n + t["data_offsets"][0])

    def __contains__(self, name):
        return name in self.table

    def shape(self, name):
        return list(self.table[name][1])

    def dtype(self, name):
        return self.table[name][2]

    def load(self, name):
        """The stored array: uint16 (BF16 bits), float32 or uint8."""
        path, shape, dt, off = self.table[name]
        if path not in self.maps:
            self.maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        size, np_dt = self.SIZES[dt]
        return self.maps[path][off:off + size * int(np.prod(shape))].view(np_dt).reshape(shape)

    def f32(self, name):
        a = self.load(name)
        return bf16_to_f32(a) if a.dtype == np.uint16 else np.asarray(a, dtype=np.float32)


class Plan:
    """The GGUF's tensors in order: (gguf name, shape in PyTorch order (bytes for MXFP4), kind
    'bf16' | 'f32' | 'mxfp4', producer of the array)."""

    def __init__(self, ck):
        self.ck, self.items = ck, []

    def add(self, gname, hname, kind="bf16", fn=None):
        """Tensor hname as gname: bf16 (BF16 stored: as is), f32, or through fn (on float32)."""
        ck = self.ck

        def make(hname=hname, fn=fn, kind=kind):
            if kind == "bf16" and fn is None and ck.dtype(hname) == "BF16":
                return ck.load(hname)
            a = ck.f32(hname)
            if fn is not None:
                a = fn(a)
            return a if kind == "f32" else f32_to_bf16(a)
        shape = ck.shape(hname) if fn is None else list(make().shape)
        self.items.append((gname, shape, kind, make))

    def raw(self, gname, shape, kind, make):
        self.items.append((gname, list(shape), kind, make))


def write_meta_common(w, cfg, L):
    """The keys TextModel.set_gguf_parameters writes for every family."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    w.add_block_count(L)
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg.get("intermediate_size", cfg.get("moe_intermediate_size")))
    w.add_head_count(cfg["num_attention_heads"])
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 1e6)))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if rope.get("rope_type", rope.get("type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if "beta_fast" in rope:
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if "beta_slow" in rope:
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])


def plan_qwen(w, cfg, ck, plan, arch, with_vocab, raw, src):
    """qwen3moe / qwen35moe (Qwen3 MoE, Qwen3.5 / 3.6 hybrid)."""
    L, E = cfg["num_hidden_layers"], cfg["num_experts"]
    H, I, hd = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["head_dim"]
    rope = cfg.get("rope_parameters", {})
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg.get("intermediate_size", I))
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
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

    add, table, load = plan.add, ck.table, ck.load
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
            plan.raw(f"blk.{b}.ffn_gate_exps.weight", [E, I, H], "bf16", lambda f=fused: load(f)[:, :I, :])
            plan.raw(f"blk.{b}.ffn_up_exps.weight", [E, I, H], "bf16", lambda f=fused: load(f)[:, I:, :])
            plan.raw(f"blk.{b}.ffn_down_exps.weight", ck.shape(down), "bf16", lambda d=down: load(d))
            continue
        plan_stacked_experts(plan, ck, p, b, E)


def plan_stacked_experts(plan, ck, p, b, E):
    """Per-expert mlp.experts.{e}.{gate,up,down}_proj -> ffn_{gate,up,down}_exps [E, rows, cols] (BF16)."""
    for g, h in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
        first = p + f"mlp.experts.0.{h}.weight"
        if ck.dtype(first) != "BF16":
            sys.exit(f"{first} is {ck.dtype(first)}; this writer expects BF16 experts")
        plan.raw(f"blk.{b}.{g}.weight", [E] + ck.shape(first), "bf16",
                 lambda p=p, h=h: np.stack([ck.load(p + f"mlp.experts.{e}.{h}.weight") for e in range(E)]))


def plan_routed_ffn(plan, ck, p, b, E):
    """The DeepSeek / GLM-4.5 FFN of layer b: dense (first_k_dense_replace layers) or router, score
    correction bias (exp_probs_b.bias), shared experts (*_shexp) and routed experts (*_exps)."""
    if p + "mlp.gate.weight" not in ck:
        for g, h in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            plan.add(f"blk.{b}.{g}.weight", p + f"mlp.{h}.weight")
        return
    plan.add(f"blk.{b}.ffn_gate_inp.weight", p + "mlp.gate.weight")
    if p + "mlp.gate.e_score_correction_bias" in ck:
        plan.add(f"blk.{b}.exp_probs_b.bias", p + "mlp.gate.e_score_correction_bias", "f32")
    if p + "mlp.shared_experts.gate_proj.weight" in ck:
        for g, h in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"), ("ffn_down_shexp", "down_proj")):
            plan.add(f"blk.{b}.{g}.weight", p + f"mlp.shared_experts.{h}.weight")
    plan_stacked_experts(plan, ck, p, b, E)


def plan_globals(plan, ck):
    """The embedding, final norm and (untied) output head, as every family names them."""
    plan.add("token_embd.weight", "embed_tokens.weight")
    plan.add("output_norm.weight", "norm.weight", "f32")
    if "lm_head.weight" in ck:
        plan.add("output.weight", "lm_head.weight")


def plan_deepseek2(w, cfg, ck, plan):
    """deepseek2 (DeepseekV2Model, for deepseek_v2 / deepseek_v3): MLA as MQA over the latent
    (head_count_kv 1, key_length kv_lora_rank + rope dim, value_length kv_lora_rank, the per-head
    sizes in key_length_mla / value_length_mla); kv_b_proj [nh * (nope + v), kv_lora] split per head
    into attn_k_b [nh, kv_lora, nope] (transposed) and attn_v_b [nh, v, kv_lora]."""
    L, E = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    nh, nope, vd, rd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["qk_rope_head_dim"]
    kv = cfg["kv_lora_rank"]
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    write_meta_common(w, cfg, L)
    w.add_head_count_kv(1)
    w.add_expert_count(E)
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    scoring = cfg.get("scoring_func", "softmax")
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if scoring == "sigmoid" else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank") is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(kv)
    w.add_key_length(kv + rd)
    w.add_value_length(kv)
    w.add_key_length_mla(nope + rd)
    w.add_value_length_mla(vd)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rd)
    if rope.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])  # llama.cpp divides by 0.1 again on load
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_tokenizer_model("none")

    add = plan.add
    plan_globals(plan, ck)
    for b in range(L):
        p, a = f"layers.{b}.", f"layers.{b}.self_attn."
        add(f"blk.{b}.attn_norm.weight", p + "input_layernorm.weight", "f32")
        if a + "q_a_proj.weight" in ck:
            add(f"blk.{b}.attn_q_a.weight", a + "q_a_proj.weight")
            add(f"blk.{b}.attn_q_a_norm.weight", a + "q_a_layernorm.weight", "f32")
            add(f"blk.{b}.attn_q_b.weight", a + "q_b_proj.weight")
        else:
            add(f"blk.{b}.attn_q.weight", a + "q_proj.weight")
        add(f"blk.{b}.attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight")
        add(f"blk.{b}.attn_kv_a_norm.weight", a + "kv_a_layernorm.weight", "f32")
        add(f"blk.{b}.attn_k_b.weight", a + "kv_b_proj.weight", "bf16",
            lambda t: np.ascontiguousarray(t.reshape(nh, nope + vd, kv)[:, :nope, :].transpose(0, 2, 1)))
        add(f"blk.{b}.attn_v_b.weight", a + "kv_b_proj.weight", "bf16",
            lambda t: np.ascontiguousarray(t.reshape(nh, nope + vd, kv)[:, nope:, :]))
        add(f"blk.{b}.attn_output.weight", a + "o_proj.weight")
        add(f"blk.{b}.ffn_norm.weight", p + "post_attention_layernorm.weight", "f32")
        plan_routed_ffn(plan, ck, p, b, E)


def plan_glm4moe(w, cfg, ck, plan):
    """glm4moe (Glm4MoeModel): q/k/v biases, partial RoPE (rope dimension head_dim * partial_rotary_factor),
    post_attention_layernorm as post_attention_norm, sigmoid routing with exp_probs_b, shared experts."""
    L, E = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    write_meta_common(w, cfg, L)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_expert_count(E)
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5))))
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob") is not None:
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_tokenizer_model("none")
    w.add_vocab_size(cfg["vocab_size"])

    add = plan.add
    plan_globals(plan, ck)
    for b in range(L):
        p, a = f"layers.{b}.", f"layers.{b}.self_attn."
        add(f"blk.{b}.attn_norm.weight", p + "input_layernorm.weight", "f32")
        for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
            add(f"blk.{b}.{g}.weight", a + h + ".weight")
            if a + h + ".bias" in ck:
                add(f"blk.{b}.{g}.bias", a + h + ".bias", "f32")
        for g, h in (("attn_q_norm", "q_norm"), ("attn_k_norm", "k_norm")):  # use_qk_norm (GLM-4.5 355B)
            if a + h + ".weight" in ck:
                add(f"blk.{b}.{g}.weight", a + h + ".weight", "f32")
        add(f"blk.{b}.post_attention_norm.weight", p + "post_attention_layernorm.weight", "f32")
        plan_routed_ffn(plan, ck, p, b, E)


def plan_gpt_oss(w, cfg, ck, plan):
    """gpt-oss (GptOssModel): sinks as attn_sinks.weight, router as ffn_gate_inp (+ bias), the fused
    gate_up (rows interleaved: gate even, up odd) split into ffn_gate_exps / ffn_up_exps (+ biases);
    MXFP4 experts repacked into ggml's MXFP4 blocks, float ones ([E, in, out]) transposed; alternating
    sliding-window layers (llama.cpp's default pattern: even layers windowed, as layer_types says)."""
    L, E = cfg["num_hidden_layers"], cfg["num_local_experts"]
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    lt = cfg.get("layer_types")
    if lt is not None and any((t == "sliding_attention") != (i % 2 == 0) for i, t in enumerate(lt)):
        sys.exit("gpt_oss: layer_types is not sliding on even layers, full on odd ones (llama.cpp's pattern)")
    write_meta_common(w, cfg, L)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_expert_count(E)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_expert_feed_forward_length(I)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_tokenizer_model("none")
    w.add_vocab_size(cfg["vocab_size"])

    add, load = plan.add, ck.load
    add("token_embd.weight", "embed_tokens.weight")
    add("output_norm.weight", "norm.weight", "f32")
    add("output.weight", "lm_head.weight")
    for b in range(L):
        p, a, m = f"layers.{b}.", f"layers.{b}.self_attn.", f"layers.{b}.mlp."
        add(f"blk.{b}.attn_norm.weight", p + "input_layernorm.weight", "f32")
        for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
            add(f"blk.{b}.{g}.weight", a + h + ".weight")
            add(f"blk.{b}.{g}.bias", a + h + ".bias", "f32")
        add(f"blk.{b}.attn_sinks.weight", a + "sinks", "f32")
        add(f"blk.{b}.post_attention_norm.weight", p + "post_attention_layernorm.weight", "f32")
        add(f"blk.{b}.ffn_gate_inp.weight", m + "router.weight")
        add(f"blk.{b}.ffn_gate_inp.bias", m + "router.bias", "f32")
        if m + "experts.gate_up_proj_blocks" in ck:  # MXFP4 [E, rows, H/32, 16] + scales [E, rows, H/32]
            def mx(bn, sn, rows):
                nb = ck.shape(bn)[2]

                def make():
                    out = np.empty((E, len(range(*rows.indices(ck.shape(bn)[1]))), nb * 17), dtype=np.uint8)
                    for e in range(E):  # one expert at a time: the nibble shuffle is several times the input
                        out[e] = mxfp4_to_ggml(np.asarray(load(bn)[e, rows]), np.asarray(load(sn)[e, rows]))
                    return out
                return make
            gu_rows, dn_rows = ck.shape(m + "experts.gate_up_proj_blocks")[1], ck.shape(m + "experts.down_proj_blocks")[1]
            nb_gu, nb_dn = ck.shape(m + "experts.gate_up_proj_blocks")[2], ck.shape(m + "experts.down_proj_blocks")[2]
            gb, gs = m + "experts.gate_up_proj_blocks", m + "experts.gate_up_proj_scales"
            plan.raw(f"blk.{b}.ffn_gate_exps.weight", [E, gu_rows // 2, nb_gu * 17], "mxfp4", mx(gb, gs, slice(0, None, 2)))
            plan.raw(f"blk.{b}.ffn_up_exps.weight", [E, gu_rows // 2, nb_gu * 17], "mxfp4", mx(gb, gs, slice(1, None, 2)))
            plan.raw(f"blk.{b}.ffn_down_exps.weight", [E, dn_rows, nb_dn * 17], "mxfp4",
                     mx(m + "experts.down_proj_blocks", m + "experts.down_proj_scales", slice(None)))
        else:  # float experts: gate_up [E, H, 2I], down [E, I, H] (in, out)
            gu, dn = m + "experts.gate_up_proj", m + "experts.down_proj"
            plan.raw(f"blk.{b}.ffn_gate_exps.weight", [E, I, H], "bf16",
                     lambda gu=gu: f32_to_bf16(ck.f32(gu)[:, :, ::2].transpose(0, 2, 1)))
            plan.raw(f"blk.{b}.ffn_up_exps.weight", [E, I, H], "bf16",
                     lambda gu=gu: f32_to_bf16(ck.f32(gu)[:, :, 1::2].transpose(0, 2, 1)))
            plan.raw(f"blk.{b}.ffn_down_exps.weight", [E, H, I], "bf16",
                     lambda dn=dn: f32_to_bf16(ck.f32(dn).transpose(0, 2, 1)))
        add(f"blk.{b}.ffn_gate_exps.bias", m + "experts.gate_up_proj_bias", "f32", lambda t: t[:, ::2])
        add(f"blk.{b}.ffn_up_exps.bias", m + "experts.gate_up_proj_bias", "f32", lambda t: t[:, 1::2])
        add(f"blk.{b}.ffn_down_exps.bias", m + "experts.down_proj_bias", "f32")


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--vocab"]
    with_vocab = "--vocab" in sys.argv[1:]
    if len(args) != 2:
        sys.exit("usage: moe_to_gguf.py MODEL_DIR OUT.gguf [--vocab]")
    src, out = Path(args[0]), Path(args[1])
    raw = json.loads((src / "config.json").read_text())
    cfg = {**raw, **raw.get("text_config", {})}
    mt = cfg.get("model_type")
    arch = ARCHS.get(mt)
    if arch is None:
        sys.exit(f"{src}: model_type {mt!r}: this writer handles {', '.join(ARCHS)}")
    if with_vocab and not arch.startswith("qwen"):
        sys.exit(f"{src}: --vocab is for the qwen families; {mt} is written with the 'none' vocabulary")
    ck = Checkpoint(src)
    plan = Plan(ck)
    w = gguf.GGUFWriter(str(out), arch)
    if arch.startswith("qwen"):
        plan_qwen(w, cfg, ck, plan, arch, with_vocab, raw, src)
    elif arch == "deepseek2":
        plan_deepseek2(w, cfg, ck, plan)
    elif arch == "glm4moe":
        plan_glm4moe(w, cfg, ck, plan)
    else:
        plan_gpt_oss(w, cfg, ck, plan)

    for name, shape, kind, _ in plan.items:
        n = int(np.prod(shape))
        if kind == "f32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), n * 4, raw_dtype=gguf.GGMLQuantizationType.F32)
        elif kind == "mxfp4":  # shape in bytes; the writer turns it into elements
            w.add_tensor_info(name, shape, np.dtype(np.uint8), n, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.uint16), n * 2, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind, make in plan.items:
        a = np.ascontiguousarray(make())
        assert list(a.shape) == shape, (name, a.shape, shape)
        w.write_tensor_data(a)
    w.close()
    print(f"{out}: {arch}, {len(plan.items)} tensors")


if __name__ == "__main__":
    main()
