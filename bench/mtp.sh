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
#   MODEL="build/models/spool-demo-moe demo-mtp-bf16.gguf" LLAMA_BIN=../llama.cpp/build/bin \
#     LLAMA_GGUF=demo-mtp-bf16.gguf CAP_FRACTIONS=0.6 DRAFT_MAX="1 2" bench/mtp.sh
#
# MODEL is a checkpoint with an MTP head (a directory: Qwen3.5/3.6 mtp.*, DeepSeek-V3 / GLM-4.5
# nextn layers, `spool synth --mtp` writes a random one; or a GGUF with blk.N.nextn.* as llama.cpp's
# converter writes it). Several, separated by spaces, run one after the other in each round, each
# its own rows (spool on the safetensors directory and on the GGUF llama.cpp runs, side by side).
# CAPS (GiB) and CAP_FRACTIONS need root and a memory cgroup controller (bench/lib.sh, shared with
# compare.sh); inside a cgroup spool streams experts with its automatic budget, and the page cache is
# dropped before each run. CAP_FRACTIONS="0.6" gives each tool its own cgroup that leaves it that
# fraction of the weights: its cgroup peak on a calibration run without a limit (tg CAP_N, first
# DRAFT_MAX) less (1 - F) x the weights' bytes (GGUF size; a directory's *.safetensors). On a small
# model the tools' fixed memory (libraries, tokenizer, buffers) is larger than the file, so F x the
# file alone would not even start them; the calibration keeps that fixed part and takes the rest
# from the weights. Environment: SPOOL_BIN (build/spool), THREADS (nproc), N (128; CAP_N 32 in cgroups),
# R (2 repetitions per invocation), ROUNDS (3), DRAFT_MAX ("1"), SPOOL_FLAGS (added to every
# spool run), OUT (a markdown file). The header records the load average (1 min) over the runs.
#
# llama.cpp (LLAMA_BIN=<its build/bin> LLAMA_GGUF=<the same model as a GGUF with its MTP head>):
# the llama.cpp of the llama-cpp-python 0.3.36 sdist has MTP speculative decoding as
# `--spec-type draft-mtp` (common/speculative.cpp: one trained MTP head for qwen35 / qwen35moe,
# the nextn layers of deepseek2, glm4-moe, qwen3next and others), with `--spec-draft-n-max N`
# drafts per step, in llama-speculative-simple (examples/, build with -DLLAMA_BUILD_EXAMPLES=ON),
# llama-server and llama-cli; llama-bench has no speculative mode. Its GGUF carries the head as
# blk.{n}.nextn.* after the main blocks (convert_hf_to_gguf.py maps Qwen3.5's mtp.* there, key
# <arch>.nextn_predict_layers). Per round and DRAFT_MAX value this script runs
#   llama-completion -m LLAMA_GGUF -no-cnv -n N --temp 0 --ignore-eos -p PROMPT                       (plain)
#   llama-speculative-simple -m LLAMA_GGUF --spec-type draft-mtp --spec-draft-n-max D -n N --temp 0 \
#     --ignore-eos -p PROMPT                                                                      (mtp)
# plain: its "eval time ... tokens per second" line (decode forwards after the prompt); mtp: the
# "decoded ... t/s" and n_drafted / n_accept lines (tokens per step = n_predict / (n_predict -
# n_accept)). llama-speculative-simple cannot run without a speculator (no --spec-type: "failed to
# initialize speculative decoding") and llama-bench -p 0 -n N decodes random tokens after no prompt,
# hence llama-completion (tools/, in the default build) for the plain row: same prompt, greedy. The
# speedup is mtp / plain of the same round; the table says when the two generated texts differ
# (compared over the shorter: speculative-simple counts the prompt's sampled token in n_predict). The
# prompt is the text spool bench uses (src/cli/bench.cpp). In a cgroup llama.cpp reads the GGUF through mmap (the page cache is charged to
# the cgroup, so it re-reads evicted pages from disk).
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=${SPOOL_BIN:-build/spool}
MODEL=${MODEL:-build/models/spool-demo-moe}
THREADS=${THREADS:-$(nproc)}
N=${N:-128} CAP_N=${CAP_N:-32} R=${R:-2} ROUNDS=${ROUNDS:-3}
DRAFT_MAX=${DRAFT_MAX:-1}
CAPS=${CAPS-} CAP_FRACTIONS=${CAP_FRACTIONS-}
SPOOL_FLAGS=${SPOOL_FLAGS:-}
LLAMA_BIN=${LLAMA_BIN:-} LLAMA_GGUF=${LLAMA_GGUF:-}
OUT=${OUT:-}
PROMPT="The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable metal type, oil-based ink and a wooden screw press. Within fifty years,"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. bench/lib.sh

[ -x "$SPOOL" ] || { echo "mtp.sh: build spool first ($SPOOL)"; exit 1; }
for m in $MODEL; do [ -e "$m" ] || { echo "mtp.sh: no model at $m"; exit 1; }; done
[ "$ROUNDS" -ge 1 ] || { echo "mtp.sh: ROUNDS must be >= 1"; exit 1; }
if [ -n "$LLAMA_BIN$LLAMA_GGUF" ]; then
  [ -n "$LLAMA_GGUF" ] && [ -f "$LLAMA_GGUF" ] || { echo "mtp.sh: LLAMA_BIN needs LLAMA_GGUF (a GGUF with the MTP head)"; exit 1; }
  for b in llama-speculative-simple llama-completion; do
    [ -x "$LLAMA_BIN/$b" ] || { echo "mtp.sh: no $b in LLAMA_BIN=$LLAMA_BIN (build llama.cpp with -DLLAMA_BUILD_EXAMPLES=ON)"; exit 1; }
  done
fi
if [ -n "$CAPS$CAP_FRACTIONS" ]; then [ "$(id -u)" -eq 0 ] || { echo "mtp.sh: CAPS and CAP_FRACTIONS need root (memory cgroups, drop_caches)"; exit 1; }; fi

# The runs, each printing its output: spool bench (plain and mtp rows) of MODEL M; llama.cpp plain
# (llama-completion) and mtp (llama-speculative-simple), the same prompt, greedy.
#   run_tool CG N D TOOL [SPOOL_CFLAGS]    TOOL: "spool <model path>", llama-plain or llama-mtp
run_tool() {
  local cg=$1 n=$2 d=$3 tool=$4 cflags=${5:-}
  case $tool in
    spool\ *)  # shellcheck disable=SC2086
      run_in "$cg" "$SPOOL" bench -m "${tool#spool }" -p 0 -n "$n" -r "$R" -t "$THREADS" --spec mtp --draft-max "$d" $cflags $SPOOL_FLAGS -o json ;;
    llama-plain)
      run_in "$cg" sh -c 'exec "$@" 2>&1 </dev/null' sh "$LLAMA_BIN/llama-completion" -m "$LLAMA_GGUF" -t "$THREADS" \
        -no-cnv -n "$n" --temp 0 --ignore-eos -c $((n + 512)) -p "$PROMPT" ;;
    llama-mtp)
      run_in "$cg" sh -c 'exec "$@" 2>&1' sh "$LLAMA_BIN/llama-speculative-simple" -m "$LLAMA_GGUF" -t "$THREADS" \
        --spec-type draft-mtp --spec-draft-n-max "$d" -n "$n" --temp 0 --ignore-eos -c $((n + 512)) -p "$PROMPT" ;;
  esac
}
tools=()
for m in $MODEL; do tools+=("spool $m"); done
[ -z "$LLAMA_BIN" ] || tools+=(llama-plain llama-mtp)
# The bytes of a model's weights: a GGUF's size, a directory's *.safetensors (the MTP head's included).
model_bytes() {
  case $1 in
    spool\ *) local m=${1#spool }; if [ -d "$m" ]; then cat "$m"/*.safetensors | wc -c; else stat -c %s "$m"; fi ;;
    *) stat -c %s "$LLAMA_GGUF" ;;
  esac
}

# configs: "NAME|CG|SPOOL_CFLAGS|N"; CG "frac:F" means one cgroup per tool, CGS["F/TOOL"].
configs=("resident||--no-stream|$N")
for cap in $CAPS; do
  cg=$(mem_cgroup "spool-mtp${cap}g" "$cap") || exit 1
  configs+=("cgroup $cap GiB|$cg||$CAP_N")
done
declare -A CGS
: > "$TMP/limits"
for f in $CAP_FRACTIONS; do
  i=0
  for t in "${tools[@]}"; do
    i=$((i + 1))
    # Calibrate: the run in a cgroup without a limit that counts (1 TiB), page cache dropped first.
    cg=$(mem_cgroup "spool-mtp-f${f}-$i" 1024) || exit 1
    cg_reset "$cg"
    run_tool "$cg" "$CAP_N" "${DRAFT_MAX%% *}" "$t" > /dev/null || { echo "mtp.sh: $t failed without a memory limit"; exit 1; }
    peak=$(cg_peak "$cg") bytes=$(model_bytes "$t")
    lim=$(python3 -c 'import sys; p, b, f = map(float, sys.argv[1:]); print((p - (1 - f) * b) / 2**30)' "$peak" "$bytes" "$f")
    CGS["$f/$t"]=$(mem_cgroup "spool-mtp-f${f}-$i" "$lim") || exit 1
    echo "  cgroup ${f}x file, $(basename "${t#spool }"): limit $(python3 -c "print(f'{$lim * 1024:.1f}')") MiB = unlimited peak $((peak >> 20)) MiB - $(python3 -c "print(1 - $f)") x $((bytes >> 20)) MiB" | tee -a "$TMP/limits"
  done
  configs+=("cgroup ${f}x file|frac:$f||$CAP_N")
done

# record CONFIG ROUND TOOL D CG OUTPUT: one line of $TMP/runs.jsonl (and the load average in $TMP/load).
record() {
  local cgpeak=0
  [ -z "$5" ] || cgpeak=$(cg_peak "$5")
  python3 -c 'import json,sys; print(json.dumps({"config": sys.argv[1], "round": int(sys.argv[2]), "tool": sys.argv[3], "draft_max": int(sys.argv[4]), "rss": int(sys.argv[5]), "cgpeak": int(sys.argv[6]), "out": sys.argv[7]}))' \
    "$1" "$2" "$3" "$4" "$(cat "$TMP/maxrss")" "$cgpeak" "$6" >> "$TMP/runs.jsonl"
  cut -d' ' -f1 /proc/loadavg >> "$TMP/load"
}

: > "$TMP/runs.jsonl"; : > "$TMP/load"
for round in $(seq 1 "$ROUNDS"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r config cg0 cflags n <<< "$c"
    for d in $DRAFT_MAX; do
      for t in "${tools[@]}"; do
        cg=$cg0
        case $cg0 in frac:*) cg=${CGS["${cg0#frac:}/$t"]} ;; esac
        [ -z "$cg" ] || cg_reset "$cg"
        out=$(run_tool "$cg" "$n" "$d" "$t" "$cflags") || out="failed $out"
        case $t in
          spool\ *)
            name="spool $(basename "${t#spool }")"
            record "$config" "$round" "$name" "$d" "$cg" "$out"
            echo "  $config, round $round/$ROUNDS, $name --draft-max $d: $(python3 -c 'import json,sys
try: j = json.loads(sys.argv[1])
except ValueError: print("failed"); sys.exit()
print(" ".join("%s %.2f t/s" % (t["test"], t["avg_ts"]) + (" (acceptance %.3f)" % t["acceptance"] if "acceptance" in t else "") for t in j))' "$out")" ;;
          *)
            record "$config" "$round" "$t" "$d" "$cg" "$out"
            echo "  $config, round $round/$ROUNDS, $t --spec-draft-n-max $d: $(python3 -c 'import re,sys
m = re.search(r"decoded\s.*speed:\s+([\d.]+) t/s", sys.argv[1]) or re.search(r"\s eval time .*?([\d.]+) tokens per second", sys.argv[1])
print(m.group(1) + " t/s" if m else "failed")' "$out")" ;;
        esac
      done
    done
  done
done

python3 - "$TMP/runs.jsonl" "$PROMPT" <<'PY' > "$TMP/table.md"
import json, re, statistics as st, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
prompt = sys.argv[2]
def sd(v): return st.stdev(v) if len(v) > 1 else 0.0
def fmt_ts(v): return f"{st.mean(v):.2f} ± {sd(v):.2f}" if v else "failed"
def llama_run(text):
    # llama-speculative-simple's "decoded N tokens in T seconds, speed: S t/s", or llama-completion's
    # "eval time = T ms / R runs (..., S tokens per second)".
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", text)
    if m: n, ts = int(m.group(1)), float(m.group(3))
    else:
        m = re.search(r"\s eval time =\s*[\d.]+ ms /\s*(\d+) runs.*?([\d.]+) tokens per second", text)
        if not m: return None
        n, ts = int(m.group(1)), float(m.group(2))
    d = re.search(r"n_drafted\s*=\s*(\d+)", text)
    a = re.search(r"n_accept\s*=\s*(\d+)", text)
    # The generated text: after the echoed prompt, up to the next log line ("<time> I ...").
    i = text.find(prompt)
    e = re.search(r"\n+\d+\.\d+\.\d+\.\d+ [A-Z] ", text[i + len(prompt):]) if i >= 0 else None
    gen = text[i + len(prompt):][:e.start()] if e else None
    return {"n": n, "ts": ts, "drafted": int(d.group(1)) if d else 0, "accepted": int(a.group(1)) if a else 0, "text": gen}
def same_text(ts):
    # One text, compared over the shortest (the two tools count generated tokens differently).
    if None in ts or not ts: return False
    k = min(len(t) for t in ts)
    return len({t[:k] for t in ts}) == 1 and k > 0
print("| config | tool | decode | tok/s | acceptance | tokens/step | speedup (per round; median) | peak RSS GiB | cgroup peak GiB |")
print("|---|---|---|---|---|---|---|---|---|")
for config in dict.fromkeys(r["config"] for r in recs):
    mine = [r for r in recs if r["config"] == config]
    def peaks(rs):
        cg = max((r["cgpeak"] for r in rs), default=0) / 2**30
        return f"{max((r['rss'] for r in rs), default=0) / 2**30:.2f} | {f'{cg:.2f}' if cg else '-'}"
    # spool (one tool per MODEL): the plain rows of every invocation pooled; one mtp row per --draft-max.
    for tool in dict.fromkeys(r["tool"] for r in mine if r["tool"].startswith("spool")):
        sp = [r for r in mine if r["tool"] == tool]
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
        print(f"| {config} | {tool}{fail} | plain | {fmt_ts(plain)} | - | - | - | {peaks(sp)} |")
        for d, e in sorted(per_d.items()):
            ratios = ", ".join(f"{x:.2f}x" for x in e["ratio"])
            note = ("" if e["same"] else " OUTPUT DIFFERS") + (f", auto-off in {e['off']} runs" if e["off"] else "")
            print(f"| {config} | {tool}{note} | mtp, draft-max {d} | {fmt_ts(e['ts'])} | {e['acc'] / max(e['dr'], 1):.3f} | "
                  f"{st.mean(e['tps']):.2f} | {ratios}; {st.median(e['ratio']):.2f}x | {peaks(e['runs'])} |")
    # llama.cpp: llama-completion (plain) and llama-speculative-simple --spec-type draft-mtp, one run each per round.
    lp = [r for r in mine if r["tool"] == "llama-plain"]
    if lp:
        base, texts = {}, set()
        for r in lp:
            g = llama_run(r["out"])
            if g: base[(r["round"], r["draft_max"])] = g["ts"]; texts.add(g["text"])
        fail = f" (failed {len(lp) - len(base)}/{len(lp)} runs)" if len(base) < len(lp) else ""
        print(f"| {config} | llama.cpp{fail} | plain | {fmt_ts(list(base.values()))} | - | - | - | {peaks(lp)} |")
        for d in sorted({r["draft_max"] for r in mine if r["tool"] == "llama-mtp"}):
            rs = [r for r in mine if r["tool"] == "llama-mtp" and r["draft_max"] == d]
            ok = [(r, g) for r, g in ((r, llama_run(r["out"])) for r in rs) if g]
            if not ok:
                print(f"| {config} | llama.cpp | draft-mtp, n-max {d} | failed | - | - | - | {peaks(rs)} |")
                continue
            ts = [g["ts"] for _, g in ok]
            acc = sum(g["accepted"] for _, g in ok) / max(sum(g["drafted"] for _, g in ok), 1)
            tps = st.mean(g["n"] / max(g["n"] - g["accepted"], 1) for _, g in ok)
            ratio = [g["ts"] / base[(r["round"], d)] for r, g in ok if (r["round"], d) in base]
            rt = (", ".join(f"{x:.2f}x" for x in ratio) + f"; {st.median(ratio):.2f}x") if ratio else "-"
            note = "" if same_text(texts | {g["text"] for _, g in ok}) else " OUTPUT DIFFERS (or not parsed)"
            fail = f" (failed {len(rs) - len(ok)}/{len(rs)} runs)" if len(ok) < len(rs) else ""
            print(f"| {config} | llama.cpp{note}{fail} | draft-mtp, n-max {d} | {fmt_ts(ts)} | {acc:.3f} | {tps:.2f} | {rt} | {peaks(rs)} |")
PY
{
  echo "MTP speculative decoding against plain decoding: $MODEL, $THREADS threads${SPOOL_FLAGS:+, spool $SPOOL_FLAGS}, $ROUNDS round(s) x $R repetitions,"
  echo "tg$N resident${CAPS}${CAP_FRACTIONS:+, tg$CAP_N in cgroups (page cache dropped before each run)}; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($(nproc) CPUs), $(date -u +%Y-%m-%d)."
  [ ! -s "$TMP/limits" ] || { echo "Memory cgroups at a fraction of the file (per tool: its peak without a limit less the rest of the weights' bytes):"; cat "$TMP/limits"; }
  echo "Load average (1 min) over the runs: $(sort -g "$TMP/load" | sed -n '1p;$p' | paste -sd- -)."
  echo "spool: each invocation runs plain and mtp greedy generations from the same prompt, repetitions interleaved; the speedup is mtp / plain of one invocation."
  [ -z "$LLAMA_BIN" ] || echo "llama.cpp: $LLAMA_GGUF; plain = llama-completion, mtp = llama-speculative-simple --spec-type draft-mtp (same prompt, greedy, one run each per round; speedup: mtp / plain of the same round)."
  echo
  cat "$TMP/table.md"
} | tee "$TMP/out.md"
[ -z "$OUT" ] || { cp "$TMP/out.md" "$OUT"; echo "wrote $OUT"; }
