# ERNIE-4.5 MoE with 16 routed experts: make_fixtures_glm_gptoss_minimax_ernie.py's held-out ernie4_5_moe (its `hidden` set: the public
# config with moe_num_experts 16, seed 5437), the checkpoint that found spool's expert-count bug (issue 28).
# transformers 5.17, f32, TF32 off. OUT=dir python3 this -> $OUT/ernie16.tar.xz
# (ernie16/models/ernie4_5_moe_e16/{config.json, generation_config.json, model.safetensors, golden.json, golden.safetensors})
import os, json, math, tarfile, torch, transformers as T
from safetensors.torch import save_file
torch.backends.cuda.matmul.allow_tf32 = False
O = os.environ["OUT"]; W = "/tmp/e16"; dev = "cuda" if torch.cuda.is_available() else "cpu"; print(T.__version__, dev)
def reinit(model, seed):  # make_fixtures_glm_gptoss_minimax_ernie.reinit
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n and p.dim() == 1:
                base = 0.0 if float(p.detach().float().abs().mean()) < 1e-6 else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif n.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                fan_in = p.shape[-1] if "experts" not in n or p.dim() == 2 else (p.shape[1] if "gate_up" in n or "down" in n else p.shape[-1])
                std = 1.0 / math.sqrt(max(fan_in, 1))
                if n.endswith(".gate.weight") or "router" in n:
                    std *= 4.0
                p.copy_(torch.randn(p.shape, generator=g) * std)
        for n, b in model.named_buffers():
            if "e_score_correction_bias" in n:
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
seed = 5437; cls = T.Ernie4_5_MoeForCausalLM
cfg = T.Ernie4_5_MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, moe_num_experts=16, moe_k=2, moe_num_shared_experts=1,
                           moe_layer_start_index=1, max_position_embeddings=256)
torch.manual_seed(seed); m = cls(cfg).float(); reinit(m, seed); m.eval()
d = W + "/models/ernie4_5_moe_e16"; os.makedirs(d, exist_ok=True); m.save_pretrained(d, safe_serialization=True)
m = cls.from_pretrained(d, dtype=torch.float32).to(dev).eval()
ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(seed + 1))
with torch.no_grad():
    lg = m(ids.to(dev)).logits.float().cpu(); gr = m.generate(ids.to(dev), max_new_tokens=12, do_sample=False, min_new_tokens=12)[0, 24:].cpu()
save_file({"input_ids": ids[0].to(torch.int32).contiguous(), "logits": lg[0].contiguous(), "greedy_ids": gr.to(torch.int32).contiguous()}, d + "/golden.safetensors")
json.dump({"model_class": type(m).__name__, "prompt_ids": ids[0].tolist(), "greedy_ids": gr.tolist(),
           "note": "logits: float32 [prompt_len, vocab] from transformers " + T.__version__}, open(d + "/golden.json", "w"), indent=1)
print("greedy", gr.tolist())
with tarfile.open(O + "/ernie16.tar.xz", "w:xz") as t: t.add(W, "ernie16")
