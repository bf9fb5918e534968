"""Shared steps of the tiny-checkpoint fixture scripts (make_fixtures_*.py in this folder).

A tiny fixture is a randomly initialised Hugging Face model saved as a checkpoint, plus its golden:
the float32 logits of a seeded random prompt and the greedy continuation transformers generates.
The scripts import this module from their own folder (python3 puts a script's folder on sys.path).
Needs torch, transformers and safetensors (requirements.txt)."""
import json
import math
import os

import torch
import transformers
from safetensors.torch import save_file


def reinit_moe(model, seed):
    """Re-initialises every parameter of `model` in place from one generator seeded with `seed`, so
    that a tiny random MoE model has non-trivial, well-scaled activations and routing:
    norm weights (1-D) -> base + 0.1 N(0,1), base 0 where the module initialised them to ~0, else 1;
    attention sinks -> N(0,1); other 1-D params (biases) -> 0.1 N(0,1);
    matrices -> N(0,1) / sqrt(fan_in), fan_in = the last dim, or dim 1 for fused 3-D expert tensors
    (gate_up_proj / down_proj stored [E, in, out]); router weights (".gate.weight", "router") x4;
    buffers named e_score_correction_bias -> 0.1 N(0,1)."""
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


def build_tiny(cfg, cls, d, seed, reinit, dev):
    """Makes `cls(cfg)` in float32 with torch seeded by `seed`, re-initialises it with `reinit(model, seed)`,
    saves it as a safetensors checkpoint in folder `d` (created if missing), and returns it reloaded
    from there (float32, on `dev`, eval mode), so the golden comes from exactly the saved weights."""
    torch.manual_seed(seed)
    model = cls(cfg).float()
    reinit(model, seed)
    model.eval()
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    return cls.from_pretrained(d, dtype=torch.float32).to(dev).eval()


def write_golden(model, d, V, seed, dev, prompt_len=24, gen=12, extra=None):
    """Writes the golden of `model` into folder `d`: a prompt of `prompt_len` ids drawn uniformly from
    [0, V) with a generator seeded `seed + 1`, its logits and `gen` greedy tokens (min_new_tokens = gen,
    so EOS does not stop it early). d/golden.safetensors: input_ids int32 [prompt_len], logits float32
    [prompt_len, V], greedy_ids int32 [gen]; d/golden.json: model_class, prompt_ids, greedy_ids, note,
    then the keys of `extra`. Returns the greedy ids (int64 tensor [gen], CPU)."""
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, V, (1, prompt_len), generator=g)
    with torch.no_grad():
        logits = model(ids.to(dev)).logits.float().cpu()
        out = model.generate(ids.to(dev), max_new_tokens=gen, do_sample=False, min_new_tokens=gen)
    greedy = out[0, prompt_len:].cpu()
    save_file({"input_ids": ids[0].to(torch.int32).contiguous(), "logits": logits[0].contiguous(),
               "greedy_ids": greedy.to(torch.int32).contiguous()}, f"{d}/golden.safetensors")
    meta = {"model_class": type(model).__name__, "prompt_ids": ids[0].tolist(), "greedy_ids": greedy.tolist(),
            "note": "logits: float32 [prompt_len, vocab] from transformers " + transformers.__version__}
    meta.update(extra or {})
    json.dump(meta, open(f"{d}/golden.json", "w"), indent=1)
    return greedy
