# ERNIE-4.5 MoE with 16 routed experts: make_fixtures_glm_gptoss_minimax_ernie.py's held-out ernie4_5_moe (its `hidden` set: the public
# config with moe_num_experts 16, seed 5437), the checkpoint that found spool's expert-count bug (issue 28).
# transformers 5.17, f32, TF32 off. OUT=dir python3 this -> $OUT/ernie16.tar.xz
# (ernie16/models/ernie4_5_moe_e16/{config.json, generation_config.json, model.safetensors, golden.json, golden.safetensors})
import os, tarfile, torch, transformers as T
from fixture_common import reinit_moe, build_tiny, write_golden
torch.backends.cuda.matmul.allow_tf32 = False
O = os.environ["OUT"]; W = "/tmp/e16"; dev = "cuda" if torch.cuda.is_available() else "cpu"; print(T.__version__, dev)
seed = 5437; cls = T.Ernie4_5_MoeForCausalLM
cfg = T.Ernie4_5_MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, moe_num_experts=16, moe_k=2, moe_num_shared_experts=1,
                           moe_layer_start_index=1, max_position_embeddings=256)
d = W + "/models/ernie4_5_moe_e16"; m = build_tiny(cfg, cls, d, seed, reinit_moe, dev)
gr = write_golden(m, d, 512, seed, dev)
print("greedy", gr.tolist())
with tarfile.open(O + "/ernie16.tar.xz", "w:xz") as t: t.add(W, "ernie16")
