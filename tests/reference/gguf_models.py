#!/usr/bin/env python3
"""Writes the test fixture models (tests/data/models/{qwen3_moe,qwen3_next,qwen3_5_moe_text,olmoe,
mixtral,glm4_moe,minimax_m2,deepseek_v2_lite,deepseek_v3,gpt_oss,gemma4_text_moe}) as GGUF files the way llama.cpp's convert_hf_to_gguf.py does (names,
1 + w norms for the hybrid architectures, A = -exp(A_log), conv1d squeezed, Qwen3.5's V heads
reordered grouped -> tiled (bench/moe_to_gguf.py's reorder_v_heads), Qwen3-Next's in_proj_qkvz split
into attn_qkv + attn_gate, experts stacked into ffn_*_exps; Mixtral as arch "llama" with q_proj /
k_proj rows permuted per head for ggml's adjacent-pair RoPE (LlamaModel.permute); GLM-4.5's
post_attention_layernorm as post_attention_norm, q/k/v biases, shared experts as ffn_*_shexp;
e_score_correction_bias as exp_probs_b.bias; gpt-oss's fused interleaved gate_up split into
ffn_gate_exps / ffn_up_exps (+ biases), sinks as attn_sinks.weight, router as ffn_gate_inp (+ bias); DeepSeek's MLA as attn_q / attn_q_a + attn_q_b,
attn_kv_a_mqa and kv_b_proj split per head into attn_k_b (transposed) + attn_v_b, or whole as
attn_kv_b for KV_B_WHOLE, head_count_kv 1; Gemma 4 (Gemma4Model, arch gemma4) with plain norms (no + 1), the
sandwich / parallel-FFN norms as post_attention_norm, ffn_norm, post_ffw_norm{,_1,_2}, pre_ffw_norm_2, the router as
ffn_gate_inp (+ .scale), per_expert_scale as ffn_down_exps.scale, layer_scalar as layer_output_scale.weight, fused experts
as ffn_gate_up_exps / ffn_down_exps, no attn_v on K = V layers and rope_freqs.weight for the proportional RoPE; the
metadata keys each converter class writes), with
the `gguf` package:

  NAME.f32.gguf  every tensor F32 (compared with the safetensors fixture)
  NAME.q.gguf    a llama.cpp-like mix of block types: matrices Q8_0 (Gemma 4's full-attention q/k/o Q4_0), token_embd Q8_0, output Q4_1,
                 attn_qkv Q5_0, expert gate Q4_0 / up Q5_1 / down MXFP4 (norms, router, conv1d F32)
  NAME.deq.gguf  NAME.q.gguf with every quantized tensor replaced by its F32 dequantization
                 (gguf.quants.dequantize): "the same model on the dequantized float weights".
                 Written for the qwen families only: ~300-550 KB each compressed, so for the others
                 src/models/gguf_model_test.cpp writes this file itself at test time (with spool's
                 dequantization, which gguf/blocks.gguf checks against gguf-py's)

  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
  /tmp/gguf-venv/bin/python tests/reference/gguf_models.py build/tests/data/models tests/data/gguf [NAME...]
  gpt_oss: not stored; src/models/gguf_model_test.cpp writes the same F32 file (byte for byte) at
  test time, this writer is its independent cross-check (cmp the two).
  gemma4_text_moe: cross-checked against llama.cpp's own converter (convert_hf_to_gguf.py of the
  llama-cpp-python 0.3.36 sdist, --outtype f32, run on the fixture with a 512-entry stub tokenizer.json
  and Gemma4Model.set_vocab stubbed out, since the fixture has no tokenizer): every gemma4.* key and all 90
  tensors equal this writer's NAME.f32.gguf bit for bit (only general.* bookkeeping keys differ).
  (reads the unpacked fixtures of the build tree; then `xz -9e` the .q/.deq files and let
  tests/reference/pack_fixtures.sh pack each NAME.f32.gguf with its checkpoint, after deleting the old pack)
"""
import json
import lzma
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from moe_to_gguf import reorder_v_heads  # noqa: E402  (grouped [nk, r, hd] -> tiled [r, nk, hd])


def read_safetensors(path):
    raw = lzma.open(path).read() if str(path).endswith(".xz") else Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(t["shape"])
        for p in ("model.language_model.", "model."):
            if name.startswith(p):
                name = name[len(p):]
                break
        out[name] = arr.copy()
    return out


ARCHS = {"qwen3_moe": "qwen3moe", "qwen3_next": "qwen3next", "qwen3_5_moe_text": "qwen35moe", "olmoe": "olmoe",
         "mixtral": "llama", "glm4_moe": "glm4moe", "minimax_m2": "minimax-m2", "deepseek_v2": "deepseek2",
         "deepseek_v3": "deepseek2", "gpt_oss": "gpt-oss"}
# deepseek2 fixtures written with kv_b_proj whole (attn_kv_b, as older converters did) instead of the
# split attn_k_b / attn_v_b of current ones, so that the loader's both forms are tested.
KV_B_WHOLE = {"deepseek_v2_lite"}


def normalise_names(w):
    """Mixtral / MiniMax-M2 block_sparse_moe names -> the mlp.* names the generic path reads."""
    out = {}
    for name, a in w.items():
        for old, new in ((".block_sparse_moe.gate.weight", ".mlp.gate.weight"),
                         (".block_sparse_moe.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
                         (".block_sparse_moe.experts.", ".mlp.experts.")):
            name = name.replace(old, new)
        if ".mlp.experts." in name:
            for old, new in ((".w1.weight", ".gate_proj.weight"), (".w3.weight", ".up_proj.weight"), (".w2.weight", ".down_proj.weight")):
                if name.endswith(old):
                    name = name[:-len(old)] + new
        out[name] = a
    return out


def llama_permute(t, n_head):
    """llama.cpp's LlamaModel.permute: within each head, row s * hd/2 + k goes to 2k + s."""
    rows = t.shape[0]
    return t.reshape(n_head, 2, rows // n_head // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def convert_gpt_oss(cfg, w):
    """gpt-oss (GptOssModel): post_attention_layernorm -> post_attention_norm, sinks -> attn_sinks.weight,
    router -> ffn_gate_inp (+ bias); float experts gate_up_proj [E, H, 2I] transposed to [E, 2I, H] and
    de-interleaved (gate = even rows, up = odd rows) into ffn_gate_exps / ffn_up_exps, their bias
    [E, 2I] likewise; down_proj [E, I, H] transposed to ffn_down_exps [E, H, I], bias as is."""
    out = [("token_embd.weight", w["embed_tokens.weight"], "embd"), ("output_norm.weight", w["norm.weight"], "norm"),
           ("output.weight", w["lm_head.weight"], "output")]
    for b in range(cfg["num_hidden_layers"]):
        p = f"layers.{b}."
        out.append((f"blk.{b}.attn_norm.weight", w[p + "input_layernorm.weight"], "norm"))
        out.append((f"blk.{b}.post_attention_norm.weight", w[p + "post_attention_layernorm.weight"], "norm"))
        for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
            out.append((f"blk.{b}.{g}.weight", w[p + f"self_attn.{h}.weight"], "matrix"))
            out.append((f"blk.{b}.{g}.bias", w[p + f"self_attn.{h}.bias"], "norm"))
        out.append((f"blk.{b}.attn_sinks.weight", w[p + "self_attn.sinks"], "norm"))
        out.append((f"blk.{b}.ffn_gate_inp.weight", w[p + "mlp.router.weight"], "norm"))
        out.append((f"blk.{b}.ffn_gate_inp.bias", w[p + "mlp.router.bias"], "norm"))
        gu = w[p + "mlp.experts.gate_up_proj"].transpose(0, 2, 1)
        gub = w[p + "mlp.experts.gate_up_proj_bias"]
        out.append((f"blk.{b}.ffn_gate_exps.weight", gu[:, ::2, :], "ffn_gate_up_exps"))
        out.append((f"blk.{b}.ffn_gate_exps.bias", gub[..., ::2], "norm"))
        out.append((f"blk.{b}.ffn_up_exps.weight", gu[:, 1::2, :], "ffn_gate_up_exps"))
        out.append((f"blk.{b}.ffn_up_exps.bias", gub[..., 1::2], "norm"))
        out.append((f"blk.{b}.ffn_down_exps.weight", w[p + "mlp.experts.down_proj"].transpose(0, 2, 1), "ffn_down_exps"))
        out.append((f"blk.{b}.ffn_down_exps.bias", w[p + "mlp.experts.down_proj_bias"], "norm"))
    return "gpt-oss", out


def convert_gemma4(cfg, w):
    """Gemma 4 (Gemma4Model(Gemma3Model), conversion/gemma.py): norm_shift 0 (plain weights), tied head (no
    output.weight), HF tensor names through tensor_mapping.py's gemma4 rows, router.scale -> ffn_gate_inp.scale,
    router.per_expert_scale -> ffn_down_exps.scale, layer_scalar -> layer_output_scale.weight, experts.gate_up_proj
    [E, 2I, H] -> ffn_gate_up_exps as is, experts.down_proj -> ffn_down_exps; generate_extra_tensors' rope_freqs
    [global_head_dim / 2]: 1 for the int(hd * partial / 2) rotated pairs, 1e30 for the rest."""
    hd_full = global_head_dim(cfg)
    partial = cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"]
    n_rot = int(hd_full * partial / 2)
    ff = np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32)
    out = [("token_embd.weight", w["embed_tokens.weight"], "embd"), ("output_norm.weight", w["norm.weight"], "norm"),
           ("rope_freqs.weight", ff, "norm")]
    if "lm_head.weight" in w and not cfg.get("tie_word_embeddings", True):
        out.append(("output.weight", w["lm_head.weight"], "output"))
    for b in range(cfg["num_hidden_layers"]):
        p = f"layers.{b}."
        for g, h in (("attn_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"),
                     ("ffn_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm"),
                     ("pre_ffw_norm_2", "pre_feedforward_layernorm_2"), ("post_ffw_norm_1", "post_feedforward_layernorm_1"),
                     ("post_ffw_norm_2", "post_feedforward_layernorm_2"), ("attn_q_norm", "self_attn.q_norm"),
                     ("attn_k_norm", "self_attn.k_norm")):
            out.append((f"blk.{b}.{g}.weight", w[p + h + ".weight"], "norm"))
        for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
            if p + f"self_attn.{h}.weight" in w:  # no v_proj on attention_k_eq_v (full) layers
                full = cfg["layer_types"][b] == "full_attention"  # head_dim 512: Q4_0 keeps the .q file small
                out.append((f"blk.{b}.{g}.weight", w[p + f"self_attn.{h}.weight"], "attn_full" if full else "matrix"))
        for g, h in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            out.append((f"blk.{b}.{g}.weight", w[p + f"mlp.{h}.weight"], "matrix"))
        out.append((f"blk.{b}.layer_output_scale.weight", w[p + "layer_scalar"], "norm"))
        out.append((f"blk.{b}.ffn_gate_inp.weight", w[p + "router.proj.weight"], "norm"))
        out.append((f"blk.{b}.ffn_gate_inp.scale", w[p + "router.scale"], "norm"))
        out.append((f"blk.{b}.ffn_gate_up_exps.weight", w[p + "experts.gate_up_proj"], "ffn_gate_exps"))
        out.append((f"blk.{b}.ffn_down_exps.weight", w[p + "experts.down_proj"], "ffn_down_exps"))
        out.append((f"blk.{b}.ffn_down_exps.scale", w[p + "router.per_expert_scale"], "norm"))
    return "gemma4", out


def global_head_dim(cfg):
    """Gemma4Model: global_head_dim, else the first full layer's per_layer_config head_dim."""
    if cfg.get("global_head_dim") is not None:
        return cfg["global_head_dim"]
    for i, c in cfg.get("per_layer_config", {}).items():
        if cfg["layer_types"][int(i)] == "full_attention" and "head_dim" in c:
            return c["head_dim"]
    raise ValueError("no full-attention head_dim")


def write_gemma4_meta(w, cfg):
    """Gemma4Model.set_gguf_parameters (after TextModel's and Gemma3Model's): the last value of each key."""
    rope = cfg["rope_parameters"]
    swa = [t == "sliding_attention" for t in cfg["layer_types"]]
    hd_full, hd_swa = global_head_dim(cfg), cfg["head_dim"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    kv_full = cfg.get("num_global_key_value_heads")
    if kv_full is None:
        for i, c in cfg.get("per_layer_config", {}).items():
            if cfg["layer_types"][int(i)] == "full_attention" and "num_key_value_heads" in c:
                kv_full = c["num_key_value_heads"]
                break
    if kv_full is not None:  # per-layer array
        w.add_head_count_kv([cfg["num_key_value_heads"] if s else kv_full for s in swa])
    else:
        w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["top_k_experts"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_shared_kv_layers(cfg["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(cfg.get("hidden_size_per_layer_input") or 0)
    w.add_sliding_window_pattern(swa)
    w.add_key_length(hd_full)
    w.add_value_length(hd_full)
    w.add_key_length_swa(hd_swa)
    w.add_value_length_swa(hd_swa)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_rope_dimension_count(hd_full)
    w.add_rope_dimension_count_swa(int(hd_swa * rope["sliding_attention"].get("partial_rotary_factor", 1.0)))


def convert(cfg, w, split_kv_b=True):
    """HF tensors -> list of (gguf name, float32 array in PyTorch order, role) with llama.cpp's transforms."""
    mt = cfg["model_type"]
    if mt == "gpt_oss":
        return convert_gpt_oss(cfg, w)
    if mt == "gemma4_text":
        return convert_gemma4(cfg, w)
    arch = ARCHS[mt]
    hybrid = arch in ("qwen3next", "qwen35moe")
    tiled = arch == "qwen35moe"
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    E = cfg.get("num_experts", cfg.get("num_local_experts", cfg.get("n_routed_experts")))
    w = normalise_names(w)
    post_norm = "post_attention_norm" if hybrid or arch == "glm4moe" else "ffn_norm"
    out = []
    plus1 = (lambda a: a + np.float32(1.0)) if hybrid else (lambda a: a)
    out.append(("token_embd.weight", w["embed_tokens.weight"], "embd"))
    out.append(("output_norm.weight", plus1(w["norm.weight"]), "norm"))
    out.append(("output.weight", w["lm_head.weight"], "output"))
    if hybrid:
        nk, nv, dk, dv = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                          cfg["linear_value_head_dim"])
        r = nv // nk
        qk = 2 * nk * dk
    for b in range(L):
        p = f"layers.{b}."
        out.append((f"blk.{b}.attn_norm.weight", plus1(w[p + "input_layernorm.weight"]), "norm"))
        out.append((f"blk.{b}.{post_norm}.weight", plus1(w[p + "post_attention_layernorm.weight"]), "norm"))
        if p + "self_attn.kv_a_proj_with_mqa.weight" in w:  # MLA (DeepseekV2Model)
            a_ = p + "self_attn."
            for g, h in (("attn_q", "q_proj"), ("attn_q_a", "q_a_proj"), ("attn_q_b", "q_b_proj"),
                         ("attn_kv_a_mqa", "kv_a_proj_with_mqa"), ("attn_output", "o_proj")):
                if a_ + h + ".weight" in w:
                    out.append((f"blk.{b}.{g}.weight", w[a_ + h + ".weight"], "matrix"))
            for g, h in (("attn_q_a_norm", "q_a_layernorm"), ("attn_kv_a_norm", "kv_a_layernorm")):
                if a_ + h + ".weight" in w:
                    out.append((f"blk.{b}.{g}.weight", w[a_ + h + ".weight"], "norm"))
            kvb = w[a_ + "kv_b_proj.weight"]
            if split_kv_b:  # per head [nope | v] rows; k_b transposed per head
                nh, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
                kvb = kvb.reshape(nh, nope + v, -1)
                out.append((f"blk.{b}.attn_k_b.weight", np.ascontiguousarray(kvb[:, :nope].transpose(0, 2, 1)), "matrix"))
                out.append((f"blk.{b}.attn_v_b.weight", np.ascontiguousarray(kvb[:, nope:]), "matrix"))
            else:
                out.append((f"blk.{b}.attn_kv_b.weight", kvb, "matrix"))
        elif p + "self_attn.q_proj.weight" in w:
            for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
                t = w[p + f"self_attn.{h}.weight"]
                if arch == "llama" and h in ("q_proj", "k_proj"):  # LlamaModel.permute
                    t = llama_permute(t, cfg["num_attention_heads"] if h == "q_proj" else cfg["num_key_value_heads"])
                out.append((f"blk.{b}.{g}.weight", t, "matrix"))
                if p + f"self_attn.{h}.bias" in w:  # GLM-4.5 attention_bias
                    out.append((f"blk.{b}.{g}.bias", w[p + f"self_attn.{h}.bias"], "norm"))
            for g, h in (("attn_q_norm", "q_norm"), ("attn_k_norm", "k_norm")):
                if p + f"self_attn.{h}.weight" in w:
                    out.append((f"blk.{b}.{g}.weight", plus1(w[p + f"self_attn.{h}.weight"]), "norm"))
        else:
            la = p + "linear_attn."
            if tiled:
                qkv, z = w[la + "in_proj_qkv.weight"], w[la + "in_proj_z.weight"]
                bb, aa = w[la + "in_proj_b.weight"], w[la + "in_proj_a.weight"]
                qkv = np.concatenate([qkv[:qk], reorder_v_heads(qkv[qk:], 0, nk, r, dv)])
                z = reorder_v_heads(z, 0, nk, r, dv)
                out.append((f"blk.{b}.ssm_beta.weight", reorder_v_heads(bb, 0, nk, r, 1), "matrix"))
                out.append((f"blk.{b}.ssm_alpha.weight", reorder_v_heads(aa, 0, nk, r, 1), "matrix"))
            else:  # Qwen3-Next: in_proj_qkvz grouped per k head [q_g, k_g, v_g, z_g] -> [q_all; k_all; v_all] + z
                qkvz = w[la + "in_proj_qkvz.weight"].reshape(nk, 2 * dk + 2 * r * dv, H)
                q_, k_ = qkvz[:, :dk], qkvz[:, dk:2 * dk]
                v_, z_ = qkvz[:, 2 * dk:2 * dk + r * dv], qkvz[:, 2 * dk + r * dv:]
                qkv = np.concatenate([q_.reshape(-1, H), k_.reshape(-1, H), v_.reshape(-1, H)])
                z = z_.reshape(-1, H)
                out.append((f"blk.{b}.ssm_ba.weight", w[la + "in_proj_ba.weight"], "matrix"))
            out.append((f"blk.{b}.attn_qkv.weight", qkv, "qkv"))
            out.append((f"blk.{b}.attn_gate.weight", z, "matrix"))
            conv = w[la + "conv1d.weight"].reshape(w[la + "conv1d.weight"].shape[0], -1)
            a = -np.exp(w[la + "A_log"].astype(np.float32))
            dt = w[la + "dt_bias"]
            o = w[la + "out_proj.weight"]
            if tiled:
                conv = np.concatenate([conv[:qk], reorder_v_heads(conv[qk:], 0, nk, r, dv)])
                a = reorder_v_heads(a[:, None], 0, nk, r, 1)[:, 0]
                dt = reorder_v_heads(dt[:, None], 0, nk, r, 1)[:, 0]
                o = reorder_v_heads(o, 1, nk, r, dv)
            out.append((f"blk.{b}.ssm_conv1d.weight", conv, "norm"))
            out.append((f"blk.{b}.ssm_a", a, "norm"))
            out.append((f"blk.{b}.ssm_dt.bias", dt, "norm"))
            out.append((f"blk.{b}.ssm_norm.weight", w[la + "norm.weight"], "norm"))
            out.append((f"blk.{b}.ssm_out.weight", o, "matrix"))
        if p + "mlp.gate.weight" not in w:  # dense layer
            for g, h in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
                out.append((f"blk.{b}.{g}.weight", w[p + f"mlp.{h}.weight"], "matrix"))
            continue
        out.append((f"blk.{b}.ffn_gate_inp.weight", w[p + "mlp.gate.weight"], "norm"))
        if p + "mlp.gate.e_score_correction_bias" in w:  # renamed e_score_correction.bias by the converters
            out.append((f"blk.{b}.exp_probs_b.bias", w[p + "mlp.gate.e_score_correction_bias"], "norm"))
        for se in ("shared_expert", "shared_experts"):  # Qwen / GLM-4.5
            if p + f"mlp.{se}.gate_proj.weight" in w:
                for g, h in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"), ("ffn_down_shexp", "down_proj")):
                    out.append((f"blk.{b}.{g}.weight", w[p + f"mlp.{se}.{h}.weight"], "matrix"))
        if p + "mlp.shared_expert_gate.weight" in w:
            out.append((f"blk.{b}.ffn_gate_inp_shexp.weight", w[p + "mlp.shared_expert_gate.weight"].reshape(-1), "norm"))
        for g, h in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
            out.append((f"blk.{b}.{g}.weight", np.stack([w[p + f"mlp.experts.{e}.{h}.weight"] for e in range(E)]), g))
    return arch, out


QUANT_MIX = {"matrix": Q.Q8_0, "attn_full": Q.Q4_0, "embd": Q.Q8_0, "output": Q.Q4_1, "qkv": Q.Q5_0,
             "ffn_gate_exps": Q.Q4_0, "ffn_up_exps": Q.Q5_1, "ffn_down_exps": Q.MXFP4,
             "ffn_gate_up_exps": Q.MXFP4}  # gpt-oss gate and up: one type (spool interleaves their rows)


def write(path, arch, cfg, tensors, mode, split_kv_b=True):
    """mode: 'f32', 'q' (QUANT_MIX) or 'deq' (QUANT_MIX values, stored F32)."""
    w = gguf.GGUFWriter(str(path), arch)
    if arch == "gemma4":
        write_gemma4_meta(w, cfg)
    else:
        write_meta(w, arch, cfg, split_kv_b)
    write_tensors(w, tensors, mode)


def write_meta(w, arch, cfg, split_kv_b):
    """The metadata keys of the qwen / olmoe / llama / glm4moe / minimax-m2 / gpt-oss / deepseek2 converters."""
    hybrid = arch in ("qwen3next", "qwen35moe")
    qwen = arch.startswith("qwen")
    rope = cfg.get("rope_parameters", {})
    hd = cfg.get("head_dim") if arch != "deepseek2" else None  # null in the Mixtral config: no key_length written
    nextn = cfg.get("num_nextn_predict_layers", 0) if arch == "glm4moe" else 0
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"] + nextn)  # GLM-4.5: the MTP layer counts (not written here)
    w.add_feed_forward_length(cfg.get("intermediate_size", cfg.get("moe_intermediate_size")))
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(1 if arch == "deepseek2" else cfg["num_key_value_heads"])
    if hd is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)
    hd = hd or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(1e-5 if arch == "olmoe" else cfg["rms_norm_eps"])  # OlmoeModel writes 1e-5
    w.add_expert_count(cfg.get("num_experts", cfg.get("num_local_experts", cfg.get("n_routed_experts"))))
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if qwen or arch == "glm4moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    elif arch == "minimax-m2":
        w.add_expert_feed_forward_length(cfg["intermediate_size"])  # olmoe / llama write none
    if arch == "llama":
        w.add_rope_dimension_count(hd)
    elif arch in ("glm4moe", "minimax-m2"):
        w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5))))
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "gpt-oss":  # GptOssModel.set_gguf_parameters + TextModel's yarn keys
        w.add_sliding_window(cfg["sliding_window"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
        if rope.get("rope_type") == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(rope["factor"])
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    if arch == "glm4moe":
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
        w.add_nextn_predict_layers(nextn)
    if arch in ("glm4moe", "deepseek2") and cfg.get("n_group") is not None:  # TextModel writes n_group / topk_group
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    if arch == "deepseek2":  # DeepseekV2Model (MLA written as MQA over the latent)
        kv, rope_d = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_vocab_size(cfg["vocab_size"])
        if cfg.get("q_lora_rank") is not None:
            w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(kv)
        if split_kv_b:
            w.add_key_length(kv + rope_d)
            w.add_value_length(kv)
            w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope_d)
            w.add_value_length_mla(cfg["v_head_dim"])
        else:  # older converters: per-head sizes in key_length / value_length
            w.add_key_length(cfg["qk_nope_head_dim"] + rope_d)
            w.add_value_length(cfg["v_head_dim"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        if cfg.get("norm_topk_prob"):
            w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg["model_type"] == "deepseek_v3"
                                 else gguf.ExpertGatingFuncType.SOFTMAX)  # the releases' scoring_func
        w.add_rope_dimension_count(rope_d)
        if rope.get("rope_type") == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(rope["factor"])
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            if rope.get("mscale_all_dim"):
                w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    if hybrid:
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
        w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
        w.add_ssm_state_size(cfg["linear_key_head_dim"])
        w.add_ssm_group_count(cfg["linear_num_key_heads"])
        w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        lt = cfg["layer_types"]
        # The fixtures' layer_types do not all follow an interval rule: write the per-layer array.
        w.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in lt])
        w.add_full_attention_interval(4)
        w.add_rope_dimension_count(int(hd * rope.get("partial_rotary_factor", 0.25)))


def write_tensors(w, tensors, mode):
    """The tensors in `mode` ('f32', 'q', 'deq'), then the file."""
    for name, a, role in tensors:
        a = np.ascontiguousarray(a, dtype=np.float32)
        qt = QUANT_MIX.get(role) if mode != "f32" else None
        if qt is not None and a.shape[-1] % gguf.GGML_QUANT_SIZES[qt][0] != 0:
            qt = Q.Q8_0 if a.shape[-1] % 32 == 0 else None
        if qt is None:
            w.add_tensor(name, a)
        elif mode == "q":
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, gguf.quants.dequantize(gguf.quants.quantize(a, qt), qt).astype(np.float32).reshape(a.shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    dst.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[3:] or ("qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "olmoe", "mixtral", "glm4_moe", "minimax_m2",
                                   "deepseek_v2_lite", "deepseek_v3", "gpt_oss", "gemma4_text_moe"):
        cfg = json.loads((src / name / "config.json").read_text())
        st = src / name / "model.safetensors"
        weights = read_safetensors(st if st.exists() else Path(str(st) + ".xz"))
        split = name not in KV_B_WHOLE
        arch, tensors = convert(cfg, weights, split)
        for mode in ("f32", "q", "deq") if name.startswith("qwen") else ("f32", "q"):
            out = dst / f"{name}.{mode}.gguf"
            write(out, arch, cfg, tensors, mode, split)
            print(out, out.stat().st_size)


if __name__ == "__main__":
    main()
