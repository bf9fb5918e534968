# Independent numpy forward of HF Ernie4_5_MoeForCausalLM (f64), per architectures-2.md section 6.
import json, sys, numpy as np
from safetensors.numpy import load_file
def forward(d, ids):
    c = json.load(open(d + "/config.json")); W = load_file(d + "/model.safetensors")
    W = {k.replace("model.", "", 1) if k.startswith("model.") else k: v.astype(np.float64) for k, v in W.items()}
    H = c["hidden_size"]; nh = c["num_attention_heads"]; nkv = c["num_key_value_heads"]; hd = H // nh
    eps = c["rms_norm_eps"]; L = c["num_hidden_layers"]; E = c["moe_num_experts"]; K = c["moe_k"]
    theta = c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0))
    start = c.get("moe_layer_start_index", 0); end = c.get("moe_layer_end_index", -1); end = L - 1 if end < 0 else end
    iv = c.get("moe_layer_interval", 1)
    def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    T = len(ids); h = W["embed_tokens.weight"][ids]
    inv = theta ** (-np.arange(0, hd, 2) / hd); ang = np.arange(T)[:, None] * inv[None]  # [T, hd/2]
    cos, sin = np.cos(ang), np.sin(ang)
    def rope(x):  # x [T, n, hd], interleaved pairs
        x0, x1 = x[..., 0::2], x[..., 1::2]; o = np.empty_like(x)
        o[..., 0::2] = x0 * cos[:, None] - x1 * sin[:, None]; o[..., 1::2] = x1 * cos[:, None] + x0 * sin[:, None]; return o
    silu = lambda z: z / (1 + np.exp(-z))
    for i in range(L):
        p = f"layers.{i}."
        a = rms(h, W[p + "input_layernorm.weight"])
        q = (a @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd); k = (a @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (a @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd); q, k = rope(q), rope(k)
        o = np.zeros((T, nh, hd)); mask = np.triu(np.full((T, T), -np.inf), 1)
        for hh in range(nh):
            g = hh // (nh // nkv); s = q[:, hh] @ k[:, g].T / np.sqrt(hd) + mask; s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
            o[:, hh] = s @ v[:, g]
        h = h + o.reshape(T, H) @ W[p + "self_attn.o_proj.weight"].T
        m = rms(h, W[p + "post_attention_layernorm.weight"])
        mlp = lambda x, pre: (silu(x @ W[pre + "gate_proj.weight"].T) * (x @ W[pre + "up_proj.weight"].T)) @ W[pre + "down_proj.weight"].T
        if (i + 1) % iv == 0 and start <= i <= end:
            z = m @ W[p + "mlp.gate.weight"].T; pz = np.exp(z - z.max(-1, keepdims=True)); pz /= pz.sum(-1, keepdims=True)
            b = W[p + "mlp.moe_statics.e_score_correction_bias"].reshape(-1)
            y = mlp(m, p + "mlp.shared_experts.")
            for t in range(T):
                S = np.argsort(-(pz[t] + b), kind="stable")[:K]; w = pz[t, S] / max(pz[t, S].sum(), 1e-12)
                for e, we in zip(S, w): y[t] += we * mlp(m[t:t + 1], p + f"mlp.experts.{e}.")[0]
            h = h + y
        else:
            h = h + mlp(m, p + "mlp.")
    return rms(h, W["norm.weight"]) @ W["embed_tokens.weight"].T
if __name__ == "__main__":
    d = sys.argv[1]; g = load_file(d + "/golden.safetensors")
    lg = forward(d, g["input_ids"].astype(np.int64)); ref = g["logits"]
    print("max abs err", np.abs(lg - ref).max(), "max |logit|", np.abs(ref).max())
