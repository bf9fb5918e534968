#!/usr/bin/env bash
# Same-run A/B of two spool builds: `spool bench` (pp / tg) of build A and build B on the same models,
# interleaved in rounds (A, B, A, B, ...) so that both see the same machine state; prints one table
# row per model, thread count and build (mean ± sd over the rounds' samples) and the per-round
# B / A ratios with their median. For "unchanged within noise" checks of a refactor and for a
# change's speed-up.
#
#   A=/path/old/spool B=build/spool MODELS="build/models/spool-demo-moe /tmp/q36-q4" THREADS="2" bench/ab.sh
# Environment: ROUNDS (5), P (128; 0 skips pp), N (64; 0 skips tg), R (2, repetitions per run), EXTRA (flags for both, e.g.
# "--device cpu"), OUT (a markdown file for the table; optional).
set -euo pipefail
A=${A:?set A to the baseline spool binary}
B=${B:?set B to the spool binary under test}
MODELS=${MODELS:?set MODELS (space-separated model paths)}
THREADS=${THREADS:-$(nproc)}
ROUNDS=${ROUNDS:-5} P=${P:-128} N=${N:-64} R=${R:-2}
EXTRA=${EXTRA:-}
OUT=${OUT:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for bin in "$A" "$B"; do [ -x "$bin" ] || { echo "ab.sh: $bin is not executable"; exit 1; }; done

for model in $MODELS; do
  for t in $THREADS; do
    for round in $(seq 1 "$ROUNDS"); do
      for side in A B; do
        bin=$A; [ "$side" = B ] && bin=$B
        # shellcheck disable=SC2086
        json=$("$bin" bench -m "$model" -p "$P" -n "$N" -r "$R" -t "$t" $EXTRA -o json 2>/dev/null) || {
          echo "ab.sh: $side ($bin) failed on $model"; exit 1; }
        python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "t": int(sys.argv[2]), "round": int(sys.argv[3]), "side": sys.argv[4], "runs": json.loads(sys.argv[5])}))' \
          "$model" "$t" "$round" "$side" "$json" >> "$TMP/runs.jsonl"
        echo "  $(basename "$model") t=$t round $round/$ROUNDS $side: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(" ".join("%s %.2f" % ("pp" if r["n_gen"] == 0 else "tg", r["avg_ts"]) for r in j))' "$json")"
      done
    done
  done
done

python3 - "$TMP/runs.jsonl" "$A" "$B" <<'PY' | tee "$TMP/table.md"
import json, statistics as st, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
print(f"A = {sys.argv[2]}, B = {sys.argv[3]}; rounds interleaved A, B per round.\n")
print("| model | threads | build | pp t/s | tg t/s | B / A pp per round (median) | B / A tg per round (median) |")
print("|---|---|---|---|---|---|---|")
keys = list(dict.fromkeys((r["model"], r["t"]) for r in recs))
def split(r):  # P=0 or N=0 skips that test: its samples are then empty
    pp = next((x for x in r["runs"] if x["n_gen"] == 0), None)
    tg = next((x for x in r["runs"] if x["n_prompt"] == 0), None)
    samples = lambda x: (x.get("samples_ts") or [x["avg_ts"]]) if x else []
    return samples(pp), samples(tg)
mean = lambda v: st.mean(v) if v else float("nan")
for m, t in keys:
    mine = [r for r in recs if r["model"] == m and r["t"] == t]
    per = {}
    for side in "AB":
        pps, tgs = [], []
        for r in (x for x in mine if x["side"] == side):
            p, g = split(r)
            pps += p
            tgs += g
            per[(side, r["round"])] = (mean(p), mean(g))
        sd = lambda v: st.stdev(v) if len(v) > 1 else 0.0
        ratio = ""
        if side == "B":
            rounds = sorted({r["round"] for r in mine})
            rp = [per[("B", k)][0] / per[("A", k)][0] for k in rounds]
            rt = [per[("B", k)][1] / per[("A", k)][1] for k in rounds]
            f = lambda v: "-" if any(x != x for x in v) else ", ".join(f"{x:.2f}" for x in v) + f" ({st.median(v):.3f})"
            ratio = f" {f(rp)} | {f(rt)} |"
        else:
            ratio = " | |"
        name = m.rstrip("/").split("/")[-1]
        cell = lambda v: f"{st.mean(v):.2f} ± {sd(v):.2f}" if v else "-"
        print(f"| {name} | {t} | {side} | {cell(pps)} | {cell(tgs)} |{ratio}")
PY
[ -z "$OUT" ] || cp "$TMP/table.md" "$OUT"
