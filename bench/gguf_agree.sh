#!/usr/bin/env bash
# Does bench/moe_to_gguf.py's GGUF make llama.cpp compute what spool computes on the safetensors?
# For one `spool synth` preset (CPU only, any machine):
#  1. writes a LAYERS-layer synthetic (BF16) and makes its constant tensors random
#     (bench/perturb_synth.py: norm gains, biases, sinks, score-correction biases), so their
#     conversion is tested too;
#  2. writes it as a BF16 GGUF (bench/moe_to_gguf.py);
#  3. spool continues IDS greedily for N tokens (`spool generate --json`: the ids; `spool serve`'s
#     /v1/completions with logprobs: their log-probabilities);
#  4. llama.cpp (bench/llama_logits.cpp, built here against a llama.cpp CPU build) runs prompt +
#     spool's tokens in one batch: the log-probability of each spool token (teacher forcing) and
#     llama.cpp's own top-1 there with its margin over the second;
#  5. prints top-1 agreement and |spool log-prob - llama.cpp log-prob| (mean, max); disagreements are
#     listed with llama.cpp's margin (a near-tie flips on rounding: llama.cpp rounds activations to
#     BF16 for BF16 weights). A wrong conversion shows as log-prob differences of 0.1-4 nats.
# Exit status 0 when it ran (judge the numbers), 1 on a failure, 2 on bad usage.
#
#   LLAMA_SRC=/path/llama.cpp LLAMA_LIB=/path/llama-build/bin PYTHON=/path/venv/bin/python \
#     bench/gguf_agree.sh gpt-oss-120b [LAYERS]
# LLAMA_SRC: the llama.cpp source (include/, ggml/include/ and gguf-py/), e.g. the llama-cpp-python 0.3.36
# sdist's vendor/llama.cpp; LLAMA_LIB: the folder with libllama.so and libggml*.so of a CPU build of it
# (cmake ... -DGGML_NATIVE=ON && ninja llama). PYTHON needs numpy (the gguf package: LLAMA_SRC/gguf-py).
# Also: IDS (prompt ids, comma-separated), N (tokens, default 16), DIR (work folder), THREADS, PORT, SPOOL.
# DeepSeek-V3's first 3 layers are dense: tiny-deepseek-v3 (3 layers, 1 dense) tests its routed experts.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 PRESET [LAYERS]" >&2; exit 2; }
PRESET=$1 LAYERS=${2:-2}
SPOOL=$(realpath "${SPOOL:-build/spool}")
LLAMA_SRC=${LLAMA_SRC:?set LLAMA_SRC (llama.cpp source folder)} LLAMA_LIB=${LLAMA_LIB:?set LLAMA_LIB (folder with libllama.so)}
PYTHON=${PYTHON:-python3} THREADS=${THREADS:-2} PORT=${PORT:-18181}
IDS=${IDS:-11,222,3333,44444,5,66,777,8888} N=${N:-16}
DIR=${DIR:-/tmp/spool-gguf-agree}
GGUF_PY=${GGUF_PY:-$LLAMA_SRC/gguf-py}
[ -x "$SPOOL" ] || { echo "gguf_agree.sh: no spool binary at $SPOOL" >&2; exit 1; }
[ -f "$LLAMA_SRC/include/llama.h" ] || { echo "gguf_agree.sh: no include/llama.h in LLAMA_SRC ($LLAMA_SRC)" >&2; exit 1; }
[ -f "$LLAMA_LIB/libllama.so" ] || { echo "gguf_agree.sh: no libllama.so in LLAMA_LIB ($LLAMA_LIB)" >&2; exit 1; }
mkdir -p "$DIR"
M=$DIR/$PRESET-${LAYERS}l G=$DIR/$PRESET-${LAYERS}l.gguf T=$DIR/llama_logits

if [ ! -f "$M/perturbed" ]; then
  rm -rf "$M"
  "$SPOOL" synth --preset "$PRESET" --layers "$LAYERS" --out "$M" -t "$THREADS" > "$DIR/synth.log" 2>&1 \
    || { tail -3 "$DIR/synth.log" >&2; exit 1; }
  "$PYTHON" bench/perturb_synth.py "$M"
  touch "$M/perturbed"
  rm -f "$G"
fi
[ -f "$G" ] || PYTHONPATH=$GGUF_PY "$PYTHON" bench/moe_to_gguf.py "$M" "$G"
if [ ! -x "$T" ] || [ bench/llama_logits.cpp -nt "$T" ]; then
  ${CXX:-g++} -O2 -std=c++17 bench/llama_logits.cpp -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" \
    -L"$LLAMA_LIB" -lllama -lggml -lggml-base -Wl,-rpath,"$(realpath "$LLAMA_LIB")" -o "$T"
fi

# spool: greedy ids, then their log-probabilities from the server (same greedy path).
"$SPOOL" generate -m "$M" --prompt-ids "$IDS" -n "$N" --temp 0 --ignore-eos --json -t "$THREADS" 2> "$DIR/generate.err" | sed -n 1p > "$DIR/gen.json"
"$SPOOL" serve -m "$M" --port "$PORT" -t "$THREADS" > "$DIR/serve.log" 2>&1 &
spid=$!
trap 'kill "$spid" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do curl -sf "localhost:$PORT/health" > /dev/null 2>&1 && break; sleep 1; done
curl -sf "localhost:$PORT/v1/completions" -H 'content-type: application/json' \
  -d "{\"prompt\":[$IDS],\"max_tokens\":$N,\"temperature\":0,\"logprobs\":1,\"ignore_eos\":true}" > "$DIR/spool.json" \
  || { echo "gguf_agree.sh: spool serve did not answer (see $DIR/serve.log)" >&2; exit 1; }
kill "$spid"; wait "$spid" 2>/dev/null || true

full=$("$PYTHON" -c "import json, sys; print(','.join(map(str, [$IDS] + json.load(open(sys.argv[1]))['output_ids'])))" "$DIR/gen.json")
"$T" "$G" "$full" 0 "$THREADS" > "$DIR/llama.out" 2> "$DIR/llama.err" || { tail -5 "$DIR/llama.err" >&2; exit 1; }
"$PYTHON" - "$IDS" "$DIR" "$PRESET" "$LAYERS" <<'PY'
import json, sys
ids, d, preset, layers = sys.argv[1:]
n_prompt = len(ids.split(","))
sp_ids = json.load(open(f"{d}/gen.json"))["output_ids"]
sp_lp = json.load(open(f"{d}/spool.json"))["choices"][0]["logprobs"]["token_logprobs"]
tf = [l.split() for l in open(f"{d}/llama.out") if l.startswith("tf ")]
tf = [x for x in tf if int(x[1]) >= n_prompt - 1]  # the positions that predict spool's tokens
if [int(x[3]) for x in tf] != sp_ids or len(sp_lp) != len(sp_ids):
    sys.exit("gguf_agree.sh: spool's generate and serve continuations differ")
ll_lp = [float(x[5]) for x in tf]
miss = [float(x[9]) for x, t in zip(tf, sp_ids) if int(x[7]) != t]
dl = [abs(a - b) for a, b in zip(sp_lp, ll_lp)]
print(f"{preset} ({layers} layers): llama.cpp top-1 = spool's token {len(sp_ids) - len(miss)}/{len(sp_ids)}"
      + (f" (misses at llama.cpp margins {', '.join(f'{m:.4f}' for m in miss)} nats)" if miss else "")
      + f"; |d log-prob| mean {sum(dl) / len(dl):.4f}, max {max(dl):.4f}")
PY
