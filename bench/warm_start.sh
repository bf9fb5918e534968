#!/usr/bin/env bash
# Warm-start benchmark (issue 32; not in CI; no root needed): how many tokens a restarted
# `spool serve` takes to reach its steady expert-cache hit rate, cold against warmed from an
# --expert-profile (docs/streaming.md#warm-starts).
#
# 1. A server with --expert-profile P (no file yet) serves RECORD_TOKENS tokens of the dev text
#    (its first part) and is stopped with SIGTERM, which writes P.
# 2. For each cache budget (FRACTIONS of the model's experts), cold and from a copy of P, the
#    hit rate of every token of TOKENS tokens from the second half of the text (other text), as
#    one sequence fed a token per step (--prefill-step-size 1, as decode runs): a restart per
#    prefix length k (spool generate --prompt-ids with the first k tokens, --max-tokens 0, --json:
#    the expert-cache counters since the start), the window between two prefix lengths is the
#    difference. The runs are deterministic (one sequence, LRU, no prefetch). Prefix lengths:
#    every token up to FINE, then every STEP tokens.
# 3. Steady hit rate = the cold run's over the second half of the TOKENS. Tokens to steady = the
#    tokens served before the first SPAN consecutive tokens whose hit rate is within 5% of it
#    (>= 0.95 x steady; a span, not one token: a single token's 64-odd expert requests are noisy);
#    excess misses = the cold start's misses minus the warm start's over all TOKENS (the fill).
# 4. The first requests as a restarted server sees them: 4 requests of a 128-token prompt (one
#    chunk at the default prefill step) and 32 generated tokens, hit rate per request (/metrics
#    before and after each), cold and warm.
# Writes bench/results/warm-start.md.
#
#   bench/warm_start.sh
#   FRACTIONS="0.25 0.5" TOKENS=512 STEP=16 bench/warm_start.sh
#   MODEL=/path/checkpoint TEXT=/path/text.txt bench/warm_start.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export SPOOL=$BUILD/spool
export MODEL=${MODEL:-$BUILD/models/spool-demo-moe}
export TEXT=${TEXT:-tests/data/corpus/dev.txt}
export FRACTIONS=${FRACTIONS:-"0.25 0.35 0.5"}
export RECORD_TOKENS=${RECORD_TOKENS:-4096}
export TOKENS=${TOKENS:-256}
export FINE=${FINE:-32}
export STEP=${STEP:-8}
export SPAN=${SPAN:-8}
export THREADS=${THREADS:-$(nproc)}
export OUT=${OUT:-bench/results/warm-start.md}
[ -x "$SPOOL" ] || { echo "warm_start.sh: build spool first ($SPOOL)"; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "warm_start.sh: no model at $MODEL (the build unpacks the demo)"; exit 1; }
TMP=$(mktemp -d)
export TMP
trap 'rm -rf "$TMP"' EXIT

python3 - <<'PY'
import json, os, re, shutil, signal, subprocess, sys, time, urllib.request, platform
from datetime import datetime, timezone

SPOOL, MODEL, TEXT, TMP, OUT = (os.environ[k] for k in ("SPOOL", "MODEL", "TEXT", "TMP", "OUT"))
FRACTIONS = [float(x) for x in os.environ["FRACTIONS"].split()]
RECORD_TOKENS, TOKENS, FINE, STEP, THREADS = (int(os.environ[k]) for k in ("RECORD_TOKENS", "TOKENS", "FINE", "STEP", "THREADS"))
SPAN = int(os.environ["SPAN"])
PREFIXES = sorted(set(list(range(1, min(FINE, TOKENS) + 1)) + list(range(FINE, TOKENS + 1, STEP)) + [TOKENS]))
BAND = 0.95  # within 5% of the steady hit rate

def run(args):
    return subprocess.run([SPOOL] + args, check=True, capture_output=True, text=True)

ids = json.loads(run(["tokenize", "--model", MODEL, "--text-file", TEXT, "--json"]).stdout)["ids"]
half = len(ids) // 2
assert RECORD_TOKENS <= half and half + TOKENS <= len(ids), "the text is too short for RECORD_TOKENS / TOKENS"

# The model's experts and the bytes of a cache slot: from the loader's line at a 1 GiB budget.
probe = run(["generate", "--model", MODEL, "--prompt-ids", "1", "--max-tokens", "1", "--threads", str(THREADS),
             "--stream", "--cache-budget-gb", "1"]).stderr
m = re.search(r"streaming (\d+) expert tensors .* cache \((\d+) experts of", probe)
n_experts, per_gib = int(m.group(1)) // 3, int(m.group(2))
slot = (1 << 30) // per_gib  # >= the slot size: k slots of this size hold k experts

def http(port, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read().decode()

class Server:
    def __init__(self, name, budget_gb, extra, step=1):
        self.log = os.path.join(TMP, name + ".log")
        args = [SPOOL, "serve", "--model", MODEL, "--port", "0", "--threads", str(THREADS), "--stream",
                "--cache-budget-gb", f"{budget_gb:.9f}", "--ctx-size", "1024", "--prompt-cache-checkpoints", "0",
                "--prefill-step-size", str(step)] + extra
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        self.port = 0
        for _ in range(600):
            time.sleep(0.1)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log).read())
            if not m:
                continue
            try:
                http(int(m.group(1)), "/health")
                self.port = int(m.group(1))
                break
            except Exception:
                pass
        if not self.port:
            sys.exit(f"warm_start.sh: the server did not start:\n{open(self.log).read()}")

    def counters(self):
        text = http(self.port, "/metrics")
        get = lambda k: int(float(re.search(rf"^{k} (\S+)$", text, re.M).group(1)))
        return get("spool_expert_cache_requests_total"), get("spool_expert_cache_hits_total")

    def complete(self, prompt, max_tokens):
        r = json.loads(http(self.port, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}))
        return r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=120)
        return open(self.log).read()

# 1. The profile of the first part of the text.
profile = os.path.join(TMP, "profile.json")
budget0 = FRACTIONS[0] * n_experts * slot / (1 << 30)
s = Server("record", budget0, ["--expert-profile", profile])
t0 = time.time()
for i in range(0, RECORD_TOKENS, 64):
    s.complete(ids[i:i + 64], 1)
record_s = time.time() - t0
log = s.stop()
assert "expert profile saved" in log, log
prof = json.load(open(profile))

def counters(budget, prefix, profile_copy):
    """Expert-cache (requests, hits) of a fresh start that served `prefix` one token per step."""
    args = ["generate", "--model", MODEL, "--prompt-ids", ",".join(map(str, prefix)), "--max-tokens", "0",
            "--prefill-step-size", "1", "--threads", str(THREADS), "--stream", "--cache-budget-gb", f"{budget:.9f}", "--json"]
    if profile_copy:
        shutil.copy(profile, profile_copy)  # each restart starts from the recorded profile (generate saves it at the end)
        args += ["--expert-profile", profile_copy]
    p = run(args)
    t = json.loads(p.stdout)["stats"]["ram_tier"]
    return t["requests"], t["hits"], p.stderr

def curve(budget, warm):
    """[(tokens before, requests, hits)] per window between consecutive prefix lengths, and the log of the last run."""
    out, prev, log = [], (0, 0, 0), ""
    copy = os.path.join(TMP, "profile-copy.json") if warm else None
    for k in PREFIXES:
        req, hit, log = counters(budget, ids[half:half + k], copy)
        out.append((prev[0], req - prev[1], hit - prev[2]))
        prev = (k, req, hit)
    return out, log

def tokens_to(ws, steady):
    """Tokens served before the first SPAN tokens whose hit rate is within 5% of `steady`."""
    starts = [s for s, _, _ in ws if s + SPAN <= TOKENS]
    for t in starts:
        if rate(ws, t, t + max(SPAN, 1 if t < FINE else STEP)) >= BAND * steady:
            return t
    return None

def rate(ws, lo, hi):
    sel = [(q, h) for s, q, h in ws if lo <= s < hi]
    return sum(h for _, h in sel) / max(sum(q for q, _ in sel), 1)

def first_requests(srv):
    rates = []
    for r in range(4):
        req0, hit0 = srv.counters()
        srv.complete(ids[half + 4096 + 160 * r: half + 4096 + 160 * r + 128], 32)
        req1, hit1 = srv.counters()
        rates.append((hit1 - hit0) / max(req1 - req0, 1))
    return rates

results = []
for frac in FRACTIONS:
    budget = frac * n_experts * slot / (1 << 30)
    runs = {}
    for mode in ("cold", "warm"):
        ws, log = curve(budget, mode == "warm")
        cap = int(re.search(r"cache \((\d+) experts of", log).group(1))
        pre = re.search(r"preloaded the (\d+) hottest", log)
        extra = []
        if mode == "warm":
            copy = os.path.join(TMP, "profile-serve.json")
            shutil.copy(profile, copy)
            extra = ["--expert-profile", copy]
        srv = Server(f"{mode}-{frac}", budget, extra, step=512)
        fr = first_requests(srv)
        srv.stop()
        runs[mode] = dict(ws=ws, cap=cap, preloaded=int(pre.group(1)) if pre else 0, first=fr)
    cold, warm = runs["cold"]["ws"], runs["warm"]["ws"]
    steady, steady_w = rate(cold, TOKENS // 2, TOKENS), rate(warm, TOKENS // 2, TOKENS)
    miss = {k: sum(r - h for _, r, h in runs[k]["ws"]) for k in runs}
    results.append(dict(frac=frac, runs=runs, steady=steady, steady_w=steady_w, t_cold=tokens_to(cold, steady),
                        t_warm=tokens_to(warm, steady), miss=miss))

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
L = []
L.append("# Warm starts: tokens to the steady expert-cache hit rate, cold and with `--expert-profile`")
L.append("")
L.append(f"`bench/warm_start.sh`, {datetime.now(timezone.utc).strftime('%Y-%m-%d')}, {cpu}, {THREADS} threads; model "
         f"`{os.path.basename(os.path.normpath(MODEL))}` ({n_experts} routed experts, streamed through the page cache), "
         f"text `{TEXT}` ({len(ids)} tokens).")
L.append("")
L.append(f"Profile: a server with `--expert-profile` served tokens 0..{RECORD_TOKENS} of the text (64 per request, "
         f"{record_s:.1f} s) and wrote it at SIGTERM: {prof['tokens_total']} tokens, half-life {prof['half_life_tokens']:.0f}. "
         f"Each start (cold, or with a copy of the profile) then served tokens {half}..{half + TOKENS} of the text (its second "
         f"half: other text) as one sequence, a token per step as decode runs them; the hit rate of every token comes from a "
         f"restart per prefix length (`spool generate --prompt-ids ... --max-tokens 0 --prefill-step-size 1 --json`), every "
         f"token up to {FINE}, then every {STEP}. Steady = the cold start's hit rate over tokens {TOKENS // 2}..{TOKENS}; tokens "
         f"to steady = tokens served before the first {SPAN} consecutive tokens whose hit rate is within 5% of it (>= 0.95 x "
         f"steady); excess misses = the cold start's misses - the warm start's over the {TOKENS} tokens.")
L.append("")
L.append("| cache (of the experts) | experts cached | preloaded | steady hit rate (cold / warm) | tokens to steady, cold | "
         "tokens to steady, warm | excess misses of cold |")
L.append("|---|---:|---:|---|---:|---:|---:|")
for r in results:
    L.append(f"| {100 * r['frac']:.0f}% | {r['runs']['cold']['cap']} | {r['runs']['warm']['preloaded']} | "
             f"{100 * r['steady']:.1f}% / {100 * r['steady_w']:.1f}% | {r['t_cold']} | {r['t_warm']} | "
             f"{r['miss']['cold'] - r['miss']['warm']} ({r['miss']['cold']} - {r['miss']['warm']}) |")
L.append("")
L.append("Counting the first token of that span too (a warm start at 0 tokens counts 1; the ratio a warm start at 0 would "
         "otherwise make infinite): " + ", ".join(f"{100 * r['frac']:.0f}%: cold {(r['t_cold'] or 0) + 1}, warm {(r['t_warm'] or 0) + 1} "
                     f"tokens, {((r['t_cold'] or 0) + 1) / ((r['t_warm'] or 0) + 1):.1f}x" for r in results) + ".")
L.append("")
agg = 32
L.append(f"Hit rate per {agg} tokens (cold / warm):")
L.append("")
L.append("| tokens | " + " | ".join(f"{100 * r['frac']:.0f}% cache" for r in results) + " |")
L.append("|---|" + "---|" * len(results))
for w0 in range(0, TOKENS, agg):
    cells = [f"{100 * rate(r['runs']['cold']['ws'], w0, w0 + agg):.1f}% / {100 * rate(r['runs']['warm']['ws'], w0, w0 + agg):.1f}%"
             for r in results]
    L.append(f"| {w0}-{w0 + agg} | " + " | ".join(cells) + " |")
L.append("")
L.append("The first 16 tokens, one by one (cold / warm):")
L.append("")
L.append("| token | " + " | ".join(f"{100 * r['frac']:.0f}% cache" for r in results) + " |")
L.append("|---|" + "---|" * len(results))
for i in range(min(16, FINE, TOKENS)):
    cells = []
    for r in results:
        c, w = r["runs"]["cold"]["ws"][i], r["runs"]["warm"]["ws"][i]
        cells.append(f"{100 * c[2] / max(c[1], 1):.1f}% / {100 * w[2] / max(w[1], 1):.1f}%")
    L.append(f"| {i + 1} | " + " | ".join(cells) + " |")
L.append("")
L.append("First requests at the default prefill step (a restarted server's first four requests: 128-token prompt, one chunk, "
         "then 32 generated tokens), hit rate per request (cold / warm):")
L.append("")
L.append("| request | " + " | ".join(f"{100 * r['frac']:.0f}% cache" for r in results) + " |")
L.append("|---|" + "---|" * len(results))
for i in range(4):
    L.append(f"| {i + 1} | " + " | ".join(f"{100 * r['runs']['cold']['first'][i]:.1f}% / {100 * r['runs']['warm']['first'][i]:.1f}%"
                                          for r in results) + " |")
L.append("")
os.makedirs(os.path.dirname(OUT), exist_ok=True)
open(OUT, "w").write("\n".join(L))
print("\n".join(L))
PY
