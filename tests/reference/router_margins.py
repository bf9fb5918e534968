# Per-token NLL and router top-(k+1) probabilities of the demo model on chosen dev-corpus
# windows, from transformers (float32), to tell routing near-ties from bugs when spool's
# per-window NLL differs from the golden.  Run on a machine with torch + transformers:
#   python3 tests/reference/router_margins.py OUT_DIR 105 10 120 77
import json, lzma, os, shutil, sys
import torch
from transformers import AutoTokenizer, Qwen3_5MoeForCausalLM

out_dir, windows = sys.argv[1], [int(w) for w in sys.argv[2:]]
src = "models/spool-demo-moe"
tmp = "/tmp/spool-demo-moe"
os.makedirs(tmp, exist_ok=True)
for f in os.listdir(src):
    if f.endswith(".xz"):
        with lzma.open(f"{src}/{f}") as i, open(f"{tmp}/{f[:-3]}", "wb") as o:
            shutil.copyfileobj(i, o)
    else:
        shutil.copy(f"{src}/{f}", tmp)
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda" if torch.cuda.is_available() else "cpu"
tok = AutoTokenizer.from_pretrained(tmp)
m = Qwen3_5MoeForCausalLM.from_pretrained(tmp, dtype=torch.float32).to(dev).eval()
ids = tok(open("tests/data/corpus/dev.txt", encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
k = m.config.num_experts_per_tok
res = {}
for w in windows:
    x = torch.tensor(ids[512 * w: 512 * w + 513])[None].to(dev)
    with torch.no_grad():
        o = m(x[:, :-1], output_router_logits=True)
    lp = torch.log_softmax(o.logits.float()[0], -1)
    nll = (-lp.gather(1, x[0, 1:, None])[:, 0]).tolist()
    routes = []
    for rl in o.router_logits:
        p = torch.softmax(rl.float().reshape(x.shape[1] - 1, -1), -1)
        v, i = torch.topk(p, k + 1, dim=-1)
        routes.append({"ids": i.cpu().tolist(), "probs": v.cpu().tolist()})
    res[w] = {"nll": nll, "routes": routes}
os.makedirs(out_dir, exist_ok=True)
json.dump(res, open(f"{out_dir}/router_margins.json", "w"))
print("done", {w: sum(r["nll"]) for w, r in res.items()})
