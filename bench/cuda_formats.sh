#!/usr/bin/env bash
# Decode of every packed format on CUDA against the GPU's measured memory bandwidth: how close the
# routed experts' GEMVs (k_gemv_quant, grouped launches: Backend::expert_ffn_routed) come to HBM.
# Runs on the GPU machine:
#  1. measures device-to-device copy bandwidth (PyTorch: 2 x bytes / time of a 4 GiB copy, best of 5),
#     the practical HBM limit;
#  2. writes a Qwen3.6-35B-A3B-shaped synthetic of LAYERS layers (`spool synth`, bf16) and converts
#     it to each FORMATS entry (`spool convert --bits B --group-size G`, or `bpwX` for --target-bpw X);
#  3. runs `spool bench --device cuda` (prompt P, N decoded tokens) on each with SPOOL_CUDA_PROFILE=1
#     and takes the stream time per call of expert_ffn_routed (one call per MoE layer and step: the
#     routed experts' gate/up and down GEMVs plus the shared expert's, in two launches, and the small
#     job/combine kernels around them);
#  4. bytes per decode call = top-k experts' + the shared expert's codes, scales and codebooks (read
#     from the checkpoint's headers); GB/s = bytes / time per call, and its share of (1).
# Writes $OUT/cuda-formats.md (table) and the logs.
#
#   OUT=/tmp/out SPOOL=cuda-stage/spool LAYERS=2 bench/cuda_formats.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=$(realpath "${SPOOL:-build/spool}")
LAYERS=${LAYERS:-2}
FORMATS=${FORMATS:-"4/64 8/32 8/64 6/64 5/64 3/64 2/64 bpw4.5"}
P=${P:-1} N=${N:-128}
DIR=${DIR:-/tmp/spool-cuda-formats}
OUT=${OUT:-/tmp}
PYTHON=${PYTHON:-python3}
THREADS=${THREADS:-$(nproc)}
mkdir -p "$DIR" "$OUT"
T=$OUT/cuda-formats.md
nvidia-smi -L >/dev/null 2>&1 || { echo "cuda_formats.sh: no GPU (nvidia-smi -L failed)" >&2; exit 1; }

hbm=$("$PYTHON" - <<'EOF'
import torch, time
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
best = 0.0
for _ in range(6):
    torch.cuda.synchronize(); t = time.perf_counter(); b.copy_(a); torch.cuda.synchronize()
    best = max(best, 2 * n / (time.perf_counter() - t) / 1e9)
print(f"{best:.0f}")
EOF
)
echo "device-to-device copy: $hbm GB/s"

src=$DIR/synth
[ -f "$src/config.json" ] || "$SPOOL" synth --preset qwen3.6-35b-a3b --layers "$LAYERS" --out "$src" --no-check -t "$THREADS" > "$OUT/cuda-formats-synth.log" 2>&1

# expert_bytes DIR: bytes of one routed expert (layer 0, expert 0) and of the shared expert, from the headers.
expert_bytes() {
  "$PYTHON" - "$1" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
sizes = {}
for f in os.listdir(d):
    if not f.endswith(".safetensors"): continue
    with open(os.path.join(d, f), "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    for k, v in h.items():
        if k != "__metadata__": sizes[k] = v["data_offsets"][1] - v["data_offsets"][0]
def total(prefix):
    return sum(s for k, s in sizes.items() if k.startswith(prefix) and not k.endswith(".signs"))
print(total("model.layers.0.mlp.experts.0."), total("model.layers.0.mlp.shared_expert."))
EOF
}

{
  echo "Routed-expert decode on CUDA per format: Qwen3.6-35B-A3B shape ($LAYERS layers, top-8 of 256 experts + shared expert), \`spool bench --device cuda -p $P -n $N\`, stream time of expert_ffn_routed per call (SPOOL_CUDA_PROFILE). Device-to-device copy: **$hbm GB/s** (PyTorch, 4 GiB)."
  echo "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)."
  echo
  echo "| format | bits/weight (experts) | decode tok/s | MB per expert call | us per call | GB/s | % of copy bandwidth |"
  echo "|---|---|---|---|---|---|---|"
} > "$T"

for f in $FORMATS; do
  q=$DIR/q-${f//\//g}
  if [ ! -f "$q/config.json" ]; then
    if [[ $f == bpw* ]]; then args=(--target-bpw "${f#bpw}"); else args=(--bits "${f%/*}" --group-size "${f#*/}"); fi
    "$SPOOL" convert -m "$src" -o "$q" "${args[@]}" -t "$THREADS" > "$OUT/cuda-formats-convert-${f//\//g}.log" 2>&1 ||
      { echo "| $f | convert failed: $(tail -1 "$OUT/cuda-formats-convert-${f//\//g}.log") |" >> "$T"; continue; }
  fi
  log=$OUT/cuda-formats-bench-${f//\//g}.log
  if ! SPOOL_CUDA_PROFILE=1 "$SPOOL" bench -m "$q" --device cuda -t "$THREADS" -p "$P" -n "$N" -r 1 > "$log" 2>&1; then
    echo "| $f | bench failed: $(tail -1 "$log") |" >> "$T"
    continue
  fi
  read -r eb sb < <(expert_bytes "$q")
  "$PYTHON" - "$f" "$log" "$eb" "$sb" "$hbm" "$q" >> "$T" <<'EOF'
import json, re, sys
f, log, eb, sb, hbm, q = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
text = open(log).read()
m = re.search(r"expert_ffn_routed\s+(\d+) calls.*stream\s+([\d.]+) s\s+([\d.]+) us/call", text)
tok = re.search(r"\|\s*tg\d+\s*\|\s*([\d.]+)", text)
cfg = json.load(open(q + "/config.json"))
cfg = cfg.get("text_config", cfg)  # (multimodal configs nest the text model's)
k = cfg.get("num_experts_per_tok", 8)
inter, hidden = cfg["moe_intermediate_size"], cfg["hidden_size"]
bpw = 8 * eb / (3 * inter * hidden)
if not m:
    print(f"| {f} | {bpw:.2f} | | | (no expert_ffn_routed in the profile: experts not on the routed path) | | |")
    sys.exit()
us = float(m.group(3))
mb = (k * eb + sb) / 1e6
gbs = mb * 1e6 / (us * 1e-6) / 1e9
print(f"| {f} | {bpw:.2f} | {tok.group(1) if tok else '?'} | {mb:.1f} | {us:.1f} | {gbs:.0f} | {100 * gbs / hbm:.0f}% |")
EOF
done
cat "$T"
