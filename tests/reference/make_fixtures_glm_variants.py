# GLM/MiniMax paths make_fixtures_glm_gptoss_minimax_ernie's public set leaves untested (transformers 5.17, CPU): q/k norm,
# head_dim 32, 2 groups; v_head_dim != qk_nope_head_dim; top-6. 2 layers (one dense, one MoE for GLM), 8 experts:
# small enough for the repository (each ~0.5 MB xz). OUT=dir python3 this -> $OUT/v.tar.xz
import os, json, math, tarfile, torch, transformers as T
from safetensors.torch import save_file
O = os.environ["OUT"]; W = "/tmp/v"; print(T.__version__)
def reinit(m, s):
    g = torch.Generator().manual_seed(s)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n and p.dim() == 1: p.copy_((0.0 if float(p.abs().mean()) < 1e-6 else 1.0) + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1: p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else: p.copy_(torch.randn(p.shape, generator=g) * (4.0 if n.endswith(".gate.weight") else 1.0) / math.sqrt(p.shape[-1]))
        for n, b in m.named_buffers():
            if "e_score_correction_bias" in n: b.copy_(torch.randn(b.shape, generator=g) * 0.1)
def go(name, cfg, cls, s):
    torch.manual_seed(s); m = cls(cfg).float(); reinit(m, s); d = W + "/" + name; m.save_pretrained(d)
    m = cls.from_pretrained(d, dtype=torch.float32).eval(); ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(s + 1))
    with torch.no_grad(): lg = m(ids).logits.float(); gr = m.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, 24:]
    save_file({"input_ids": ids[0].int().contiguous(), "logits": lg[0].contiguous(), "greedy_ids": gr.int().contiguous()}, d + "/golden.safetensors")
    json.dump({"model_class": type(m).__name__, "prompt_ids": ids[0].tolist(), "greedy_ids": gr.tolist(), "note": "logits: float32 from transformers " + T.__version__}, open(d + "/golden.json", "w"), indent=1)
c = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256, num_experts_per_tok=4)
go("glm4_moe_qknorm", T.Glm4MoeConfig(**c, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=2, head_dim=32, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5, n_group=2, topk_group=1, first_k_dense_replace=1, use_qk_norm=True, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), T.Glm4MoeForCausalLM, 11)
go("glm4_moe_lite_v24", T.Glm4MoeLiteConfig(**c, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=1.8, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=24, qk_nope_head_dim=16), T.Glm4MoeLiteForCausalLM, 12)
c["num_experts_per_tok"] = 6
go("minimax_m2_top6", T.MiniMaxM2Config(**c, intermediate_size=32, num_key_value_heads=2, head_dim=16, num_local_experts=8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), T.MiniMaxM2ForCausalLM, 13)
with tarfile.open(O + "/v.tar.xz", "w:xz") as t: t.add(W, "v")
