#!/usr/bin/env bash
# Constrained-decoding speed evidence (issue 29), in one run with interleaved rounds:
#  1. Unconstrained decode speed of build A (before the constrained-decoding merge) and build B
#     (at it) end to end through `spool serve`: /v1/chat/completions at temperature 0 with
#     max_tokens N, requests alternating A, B, B, A, ... against two servers loaded side by side;
#     decode tokens/s per request = Δspool_generated_tokens_total / Δspool_decode_seconds_total of
#     that server's /metrics (prefill excluded), with the client's wall-clock tokens/s beside it.
#  2. `spool bench -p 0 -n N` of A and B through bench/ab.sh (same interleaving).
#  3. Overhead of a forced call on build C: the same prompt and tools with tool_choice "required"
#     (a tool with a small JSON schema: the grammar masks every token) and "auto" (no mask),
#     alternating, ms per generated token from the same /metrics deltas.
# Prints markdown tables (and writes them to OUT when set).
#
#   A=/path/before/spool B=/path/at-merge/spool C=build/spool bench/constrain.sh
# Environment: MODEL_AB (model for A and B; default: B's build/models/spool-demo-moe), MODEL
# (model for C; default: C's build/models/spool-demo-moe), ROUNDS (5), N (128), THREADS (2),
# PORT (18480: uses PORT..PORT+2), SKIP_AB=1 (skip step 2), OUT (a markdown file).
set -euo pipefail
A=${A:?set A to the spool binary before the merge}
B=${B:?set B to the spool binary at the merge}
C=${C:-build/spool}
MODEL_AB=${MODEL_AB:-$(dirname "$B")/models/spool-demo-moe}
MODEL=${MODEL:-$(dirname "$C")/models/spool-demo-moe}
ROUNDS=${ROUNDS:-5} N=${N:-128} THREADS=${THREADS:-2} PORT=${PORT:-18480}
OUT=${OUT:-}
for bin in "$A" "$B" "$C"; do [ -x "$bin" ] || { echo "constrain.sh: $bin is not executable"; exit 1; }; done
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

# serve BIN MODEL PORT: starts a server and waits until /health answers 200.
serve() {
  "$1" serve -m "$2" -t "$THREADS" --port "$3" > "$TMP/serve-$3.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$3/health" > /dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "constrain.sh: $1 did not come up on port $3"; cat "$TMP/serve-$3.log"; exit 1
}

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$TMP/head.md"

serve "$A" "$MODEL_AB" "$PORT"
serve "$B" "$MODEL_AB" $((PORT + 1))
serve "$C" "$MODEL" $((PORT + 2))

python3 - "$PORT" "$ROUNDS" "$N" "$A" "$B" "$C" "${PIDS[@]}" > "$TMP/serve.md" <<'PY'
import json, os, statistics as st, sys, time, urllib.request
port, rounds, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
names = {"A": sys.argv[4], "B": sys.argv[5], "C": sys.argv[6]}
ports = {"A": port, "B": port + 1, "C": port + 2}
pids = {"A": sys.argv[7], "B": sys.argv[8], "C": sys.argv[9]}
TICK = os.sysconf("SC_CLK_TCK")

def cpu(side):  # seconds of CPU the server process has used (user + system, all threads)
    f = open(f"/proc/{pids[side]}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK

def metrics(side):
    text = urllib.request.urlopen(f"http://127.0.0.1:{ports[side]}/metrics").read().decode()
    vals = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            vals[k] = float(v)
    return vals["spool_generated_tokens_total"], vals["spool_decode_seconds_total"]

def chat(side, body):
    g0, d0 = metrics(side)
    c0 = cpu(side)
    req = urllib.request.Request(f"http://127.0.0.1:{ports[side]}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.loads(urllib.request.urlopen(req).read())
    wall = time.perf_counter() - t0
    c1 = cpu(side)
    g1, d1 = metrics(side)
    toks = r["usage"]["completion_tokens"]
    assert g1 - g0 == toks, (g1 - g0, toks)
    return r, toks, d1 - d0, wall, c1 - c0

prompt = [{"role": "user", "content": "Tell me about the sea, the whales that swim in it and the ships that sail on it."}]
plain = {"messages": prompt, "temperature": 0, "max_tokens": n}
# Step 1: unconstrained decode, A vs B, one warm-up request each, then interleaved rounds.
for s in "AB":
    chat(s, plain)
rows = []
for k in range(1, rounds + 1):
    row = {}
    for s in ("AB" if k % 2 else "BA"):  # ABBA order: neither build always goes first
        _, toks, dec, wall, c = chat(s, plain)
        row[s] = (toks, toks / dec, toks / wall, 1000 * c / toks)
    rows.append(row)
    print(f"  round {k}: A {row['A'][1]:.1f} t/s, B {row['B'][1]:.1f} t/s", file=sys.stderr)
print(f"### Unconstrained decode through `spool serve` (/v1/chat/completions, temperature 0, max_tokens {n})\n")
print(f"A = {names['A']}, B = {names['B']}; requests interleaved, A then B in odd rounds, B then A in even ones; decode t/s from /metrics deltas (prefill excluded), wall t/s = tokens / request time, CPU ms/token = the server process's user+system CPU time over the request / tokens (10 ms ticks; prefill included).\n")
print("| round | A tokens | A decode t/s | A wall t/s | A CPU ms/token | B tokens | B decode t/s | B wall t/s | B CPU ms/token | B / A decode t/s | B / A CPU ms/token |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
ratios, cratios = [], []
for k, row in enumerate(rows, 1):
    a, b = row["A"], row["B"]
    ratios.append(b[1] / a[1])
    cratios.append(b[3] / a[3] if a[3] > 0 else float("nan"))
    print(f"| {k} | {a[0]} | {a[1]:.1f} | {a[2]:.1f} | {a[3]:.2f} | {b[0]} | {b[1]:.1f} | {b[2]:.1f} | {b[3]:.2f} | {ratios[-1]:.3f} | {cratios[-1]:.3f} |")
med = lambda side, i: st.median(r[side][i] for r in rows)
print(f"| median | | {med('A', 1):.1f} | {med('A', 2):.1f} | {med('A', 3):.2f} | | {med('B', 1):.1f} | {med('B', 2):.1f} | {med('B', 3):.2f} | "
      f"**{st.median(ratios):.3f}** | **{st.median(cratios):.3f}** |\n")

# Step 3: forced call vs free answer on C, same prompt and tools.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                         "required": ["city", "unit"], "additionalProperties": False}}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
body = lambda choice: {"messages": ask, "tools": tools, "tool_choice": choice, "temperature": 0, "max_tokens": n}
for c in ("auto", "required"):
    chat("C", body(c))
rows = []
for k in range(1, rounds + 1):
    row = {}
    for c in (("auto", "required") if k % 2 else ("required", "auto")):
        r, toks, dec, wall, cs = chat("C", body(c))
        calls = r["choices"][0]["message"].get("tool_calls") or []
        row[c] = (toks, 1000 * dec / toks, 1000 * wall / toks, r["choices"][0]["finish_reason"], len(calls), 1000 * cs / toks)
    rows.append(row)
    print(f"  round {k}: auto {row['auto'][1]:.2f} ms/token, required {row['required'][1]:.2f} ms/token", file=sys.stderr)
print(f"### Forced call (tool_choice \"required\", grammar mask every token) vs \"auto\" (no mask), build C = {names['C']}\n")
print("Same prompt and tool (`get_weather`, schema: city string maxLength 24, unit enum), temperature 0, max_tokens "
      f"{n}; interleaved, auto first in odd rounds, required first in even ones; ms per generated token from /metrics decode seconds (wall and CPU ms/token beside it include the prefill, spread over fewer tokens for the shorter forced call).\n")
print("| round | auto tokens | auto ms/token | auto wall ms/token | auto CPU ms/token | required tokens (finish, calls) | required ms/token | required wall ms/token | required CPU ms/token | required / auto ms/token | required / auto CPU |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
ratios, cratios = [], []
for k, row in enumerate(rows, 1):
    a, q = row["auto"], row["required"]
    ratios.append(q[1] / a[1])
    cratios.append(q[5] / a[5] if a[5] > 0 else float("nan"))
    print(f"| {k} | {a[0]} | {a[1]:.2f} | {a[2]:.2f} | {a[5]:.2f} | {q[0]} ({q[3]}, {q[4]}) | {q[1]:.2f} | {q[2]:.2f} | {q[5]:.2f} | {ratios[-1]:.3f} | {cratios[-1]:.3f} |")
med = lambda side, i: st.median(r[side][i] for r in rows)
print(f"| median | | {med('auto', 1):.2f} | {med('auto', 2):.2f} | {med('auto', 5):.2f} | | {med('required', 1):.2f} | {med('required', 2):.2f} | "
      f"{med('required', 5):.2f} | **{st.median(ratios):.3f}** | **{st.median(cratios):.3f}** |\n")
PY
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
PIDS=()

{
  cat "$TMP/head.md"
  echo
  cat "$TMP/serve.md"
  if [ "${SKIP_AB:-0}" != 1 ]; then
    echo "### spool bench -p 0 -n $N (bench/ab.sh, $ROUNDS rounds, 2 repetitions each)"
    echo
    A="$A" B="$B" MODELS="$MODEL_AB" THREADS="$THREADS" ROUNDS="$ROUNDS" P=0 N="$N" R=2 OUT="$TMP/ab.md" "$(dirname "$0")/ab.sh" > "$TMP/ab.log" 2>&1 ||
      { cat "$TMP/ab.log"; exit 1; }
    cat "$TMP/ab.md"
    echo
  fi
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "${OUT:-/dev/null}"
