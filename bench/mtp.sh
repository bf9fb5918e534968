#!/usr/bin/env bash
# Speculative decoding with the model's own MTP head (--spec mtp) against plain decoding, on one
# machine, in one run. Each round runs, per config (resident; then inside each memory cgroup of
# CAPS GiB) and per DRAFT_MAX value, one `spool bench -p 0 -n N --spec mtp --draft-max D`: that
# one invocation measures the plain and the mtp tg rows itself, repetitions interleaved (plain,
# mtp, mtp, plain, ...), both greedy generations of N tokens from the same prompt. Rounds repeat
# the whole sequence (ROUNDS), so each row pools samples spread over the run; the speedup is the
# median over rounds of mtp / plain of the same invocation. Prints (and with OUT, writes) a
# markdown table: tok/s, draft acceptance, tokens per verify step, speedup, peak RSS, cgroup peak.
#
#   bench/mtp.sh                                                # the demo model, resident
#   MODEL=/ckpt/qwen3.6-35b-a3b DRAFT_MAX="1 2 3" CAPS="24 16" N=128 ROUNDS=3 bench/mtp.sh
#   SPOOL_FLAGS="--device cpu" THREADS=8 OUT=bench/results/mtp.md bench/mtp.sh
#
# MODEL is a checkpoint directory with an MTP head (Qwen3.5/3.6 mtp.*, DeepSeek-V3 / GLM-4.5
# nextn layers; `spool synth --mtp` writes a random one; spool does not read GGUF MTP heads yet).
# CAPS needs root and a memory cgroup controller (bench/lib.sh, shared with compare.sh); inside
# a cgroup spool streams experts with its automatic budget, and the page cache is dropped before
# each run. Environment: SPOOL_BIN (build/spool), THREADS (nproc), N (128; CAP_N 32 in cgroups),
# R (2 repetitions per invocation), ROUNDS (3), DRAFT_MAX ("1"), SPOOL_FLAGS (added to every
# spool run), OUT (a markdown file).
#
# llama.cpp (LLAMA_BIN=<its build/bin> LLAMA_GGUF=<the same model as a GGUF with its MTP head>):
# the llama.cpp of the llama-cpp-python 0.3.36 sdist has MTP speculative decoding as
# `--spec-type draft-mtp` (common/speculative.cpp: one trained MTP head for qwen35 / qwen35moe,
# the nextn layers of deepseek2, glm4-moe, qwen3next and others), with `--spec-draft-n-max N`
# drafts per step, in llama-speculative-simple (examples/, build with -DLLAMA_BUILD_EXAMPLES=ON),
# llama-server and llama-cli; llama-bench has no speculative mode. Its GGUF carries the head as
# blk.{n}.nextn.* after the main blocks (convert_hf_to_gguf.py maps Qwen3.5's mtp.* there, key
# <arch>.nextn_predict_layers). Per round and DRAFT_MAX value this script runs
#   llama-speculative-simple -m LLAMA_GGUF --spec-type draft-mtp --spec-draft-n-max D -n N --temp 0 --ignore-eos -p PROMPT
# (its "decoded ... t/s" and n_drafted / n_accept lines; tokens per step = n_predict /
# (n_predict - n_accept)), against llama-bench -p 0 -n N (random-token decode, no prompt) of the
# same file as the plain row. The prompt is the text spool bench uses (src/cli/bench.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=${SPOOL_BIN:-build/spool}
MODEL=${MODEL:-build/models/spool-demo-moe}
THREADS=${THREADS:-$(nproc)}
N=${N:-128} CAP_N=${CAP_N:-32} R=${R:-2} ROUNDS=${ROUNDS:-3}
DRAFT_MAX=${DRAFT_MAX:-1}
CAPS=${CAPS-}
SPOOL_FLAGS=${SPOOL_FLAGS:-}
LLAMA_BIN=${LLAMA_BIN:-} LLAMA_GGUF=${LLAMA_GGUF:-}
OUT=${OUT:-}
PROMPT="The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable metal type, oil-based ink and a wooden screw press. Within fifty years,"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. bench/lib.sh

[ -x "$SPOOL" ] || { echo "mtp.sh: build spool first ($SPOOL)"; exit 1; }
[ -e "$MODEL" ] || { echo "mtp.sh: no model at $MODEL"; exit 1; }
[ "$ROUNDS" -ge 1 ] || { echo "mtp.sh: ROUNDS must be >= 1"; exit 1; }
if [ -n "$LLAMA_BIN$LLAMA_GGUF" ]; then
  [ -n "$LLAMA_GGUF" ] && [ -f "$LLAMA_GGUF" ] || { echo "mtp.sh: LLAMA_BIN needs LLAMA_GGUF (a GGUF with the MTP head)"; exit 1; }
  for b in llama-speculative-simple llama-bench; do
    [ -x "$LLAMA_BIN/$b" ] || { echo "mtp.sh: no $b in LLAMA_BIN=$LLAMA_BIN (build llama.cpp with -DLLAMA_BUILD_EXAMPLES=ON)"; exit 1; }
  done
fi
if [ -n "$CAPS" ]; then [ "$(id -u)" -eq 0 ] || { echo "mtp.sh: CAPS needs root (memory cgroups, drop_caches)"; exit 1; }; fi

configs=("resident||--no-stream|$N")
for cap in $CAPS; do
  cg=$(mem_cgroup "spool-mtp${cap}g" "$cap") || exit 1
  configs+=("cgroup $cap GiB|$cg||$CAP_N")
done

# record CONFIG ROUND TOOL D CG JSON: one line of $TMP/runs.jsonl.
record() {
  local cgpeak=0
  [ -z "$5" ] || cgpeak=$(cg_peak "$5")
  python3 -c 'import json,sys; print(json.dumps({"config": sys.argv[1], "round": int(sys.argv[2]), "tool": sys.argv[3], "draft_max": int(sys.argv[4]), "rss": int(sys.argv[5]), "cgpeak": int(sys.argv[6]), "out": sys.argv[7]}))' \
    "$1" "$2" "$3" "$4" "$(cat "$TMP/maxrss")" "$cgpeak" "$6" >> "$TMP/runs.jsonl"
}

: > "$TMP/runs.jsonl"
for round in $(seq 1 "$ROUNDS"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r config cg cflags n <<< "$c"
    for d in $DRAFT_MAX; do
      [ -z "$cg" ] || cg_reset "$cg"
      # shellcheck disable=SC2086
      out=$(run_in "$cg" "$SPOOL" bench -m "$MODEL" -p 0 -n "$n" -r "$R" -t "$THREADS" --spec mtp --draft-max "$d" $cflags $SPOOL_FLAGS -o json) || out=failed
      record "$config" "$round" spool "$d" "$cg" "$out"
      echo "  $config, round $round/$ROUNDS, spool --draft-max $d: $(python3 -c 'import json,sys
try: j = json.loads(sys.argv[1])
except ValueError: print("failed"); sys.exit()
print(" ".join("%s %.2f t/s" % (t["test"], t["avg_ts"]) + (" (acceptance %.3f)" % t["acceptance"] if "acceptance" in t else "") for t in j))' "$out")"
      if [ -n "$LLAMA_BIN" ]; then
        [ -z "$cg" ] || cg_reset "$cg"
        out=$(run_in "$cg" "$LLAMA_BIN/llama-bench" -m "$LLAMA_GGUF" -p 0 -n "$n" -r "$R" -t "$THREADS" -o json) || out=failed
        record "$config" "$round" llama-bench "$d" "$cg" "$out"
        [ -z "$cg" ] || cg_reset "$cg"
        out=$(run_in "$cg" sh -c 'exec "$@" 2>&1' sh "$LLAMA_BIN/llama-speculative-simple" -m "$LLAMA_GGUF" -t "$THREADS" \
          --spec-type draft-mtp --spec-draft-n-max "$d" -n "$n" --temp 0 --ignore-eos -c $((n + 512)) -p "$PROMPT") || out="failed $out"
        record "$config" "$round" llama-spec "$d" "$cg" "$out"
        echo "  $config, round $round/$ROUNDS, llama.cpp: llama-bench and llama-speculative-simple --spec-draft-n-max $d done"
      fi
    done
  done
done

python3 - "$TMP/runs.jsonl" <<'PY' > "$TMP/table.md"
import json, re, statistics as st, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
def sd(v): return st.stdev(v) if len(v) > 1 else 0.0
def fmt_ts(v): return f"{st.mean(v):.2f} ± {sd(v):.2f}" if v else "failed"
def llama_spec(text):
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", text)
    d = re.search(r"n_drafted\s*=\s*(\d+)", text)
    a = re.search(r"n_accept\s*=\s*(\d+)", text)
    if not (m and d and a): return None
    return {"n": int(m.group(1)), "ts": float(m.group(3)), "drafted": int(d.group(1)), "accepted": int(a.group(1))}
print("| config | tool | decode | tok/s | acceptance | tokens/step | speedup (per round; median) | peak RSS GiB | cgroup peak GiB |")
print("|---|---|---|---|---|---|---|---|---|")
for config in dict.fromkeys(r["config"] for r in recs):
    mine = [r for r in recs if r["config"] == config]
    def peaks(rs):
        cg = max((r["cgpeak"] for r in rs), default=0) / 2**30
        return f"{max((r['rss'] for r in rs), default=0) / 2**30:.2f} | {f'{cg:.2f}' if cg else '-'}"
    # spool: the plain rows of every invocation pooled; one mtp row per --draft-max.
    sp = [r for r in mine if r["tool"] == "spool"]
    plain, per_d, failed = [], {}, 0
    for r in sp:
        try: rows = json.loads(r["out"])
        except ValueError: failed += 1; continue
        p = next(t for t in rows if t.get("spec") == "none")
        m = next(t for t in rows if t.get("spec") == "mtp")
        plain += p["samples_ts"]
        e = per_d.setdefault(r["draft_max"], {"ts": [], "acc": 0, "dr": 0, "tps": [], "ratio": [], "same": True, "off": 0, "runs": []})
        e["ts"] += m["samples_ts"]; e["acc"] += m["accepted"]; e["dr"] += m["drafted"]
        e["tps"].append(m["tokens_per_step"]); e["ratio"].append(m["speedup"]); e["same"] &= m["same_output"] and p["same_output"]
        e["off"] += m["auto_off_runs"]; e["runs"].append(r)
    fail = f" (failed {failed}/{len(sp)} runs)" if failed else ""
    if sp:
        print(f"| {config} | spool{fail} | plain | {fmt_ts(plain)} | - | - | - | {peaks(sp)} |")
    for d, e in sorted(per_d.items()):
        ratios = ", ".join(f"{x:.2f}x" for x in e["ratio"])
        note = ("" if e["same"] else " OUTPUT DIFFERS") + (f", auto-off in {e['off']} runs" if e["off"] else "")
        print(f"| {config} | spool{note} | mtp, draft-max {d} | {fmt_ts(e['ts'])} | {e['acc'] / max(e['dr'], 1):.3f} | "
              f"{st.mean(e['tps']):.2f} | {ratios}; {st.median(e['ratio']):.2f}x | {peaks(e['runs'])} |")
    # llama.cpp: llama-bench tg (plain) and llama-speculative-simple --spec-type draft-mtp per round.
    lb = [r for r in mine if r["tool"] == "llama-bench"]
    if lb:
        base = {}
        for r in lb:
            try: t = next(x for x in json.loads(r["out"]) if x["n_prompt"] == 0)
            except (ValueError, StopIteration): continue
            base.setdefault(r["round"], []).extend(t.get("samples_ts") or [t["avg_ts"]])
        allb = [x for v in base.values() for x in v]
        print(f"| {config} | llama.cpp | plain (llama-bench tg) | {fmt_ts(allb)} | - | - | - | {peaks(lb)} |")
        for d in sorted({r["draft_max"] for r in mine if r["tool"] == "llama-spec"}):
            rs = [r for r in mine if r["tool"] == "llama-spec" and r["draft_max"] == d]
            got = [(r, llama_spec(r["out"])) for r in rs]
            ok = [(r, g) for r, g in got if g]
            if not ok:
                print(f"| {config} | llama.cpp | draft-mtp, n-max {d} | failed | - | - | - | {peaks(rs)} |")
                continue
            ts = [g["ts"] for _, g in ok]
            acc = sum(g["accepted"] for _, g in ok) / max(sum(g["drafted"] for _, g in ok), 1)
            tps = st.mean(g["n"] / max(g["n"] - g["accepted"], 1) for _, g in ok)
            ratio = [g["ts"] / st.mean(base[r["round"]]) for r, g in ok if base.get(r["round"])]
            rt = (", ".join(f"{x:.2f}x" for x in ratio) + f"; {st.median(ratio):.2f}x") if ratio else "-"
            print(f"| {config} | llama.cpp | draft-mtp, n-max {d} | {fmt_ts(ts)} | {acc:.3f} | {tps:.2f} | {rt} | {peaks(rs)} |")
PY
{
  echo "MTP speculative decoding against plain decoding: $MODEL, $THREADS threads${SPOOL_FLAGS:+, spool $SPOOL_FLAGS}, $ROUNDS round(s) x $R repetitions,"
  echo "tg$N resident${CAPS:+, tg$CAP_N in cgroups (page cache dropped before each run)}; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($(nproc) CPUs), $(date -u +%Y-%m-%d)."
  echo "spool: each invocation runs plain and mtp greedy generations from the same prompt, repetitions interleaved; the speedup is mtp / plain of one invocation."
  [ -z "$LLAMA_BIN" ] || echo "llama.cpp: $LLAMA_GGUF; plain = llama-bench tg (random tokens), mtp = llama-speculative-simple --spec-type draft-mtp (same prompt, greedy, one run per round)."
  echo
  cat "$TMP/table.md"
} | tee "$TMP/out.md"
[ -z "$OUT" ] || { cp "$TMP/out.md" "$OUT"; echo "wrote $OUT"; }
