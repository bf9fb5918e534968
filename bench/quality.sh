#!/usr/bin/env bash
# Quality per byte (not in CI): one bf16 model, one text; llama.cpp's llama-quantize types and spool's
# recipes, every file scored by `spool perplexity --kl-reference` against the bf16 model on the same
# tokens: mean KL(bf16 || quantized) per token, top-1 agreement, perplexity, size and bits per weight.
# One type is cross-checked against llama-perplexity --kl-divergence on llama-perplexity's own
# chunks. Writes bench/results/quality-<name>.md and quality-<name>.png (gnuplot, when installed).
#
#   bench/quality.sh                                    # the demo model on the dev corpus
#   bench/quality.sh /path/to/spool-wide-moe tests/data/corpus/dev.txt
#   CHUNKS=40 TYPES="Q4_K_M IQ4_XS" RECIPES="q4" bench/quality.sh   # a quick look
#
# Environment:
#   LLAMA_SRC     llama.cpp source tree with convert_hf_to_gguf.py (the llama-cpp-python 0.3.36 sdist's
#                 vendor/llama.cpp; built beside it as in bench/compare.sh's header)
#   LLAMA_BIN     its build/bin with llama-quantize, llama-imatrix, llama-perplexity
#   PYTHON        a Python with what the converter imports (torch, numpy, sentencepiece, transformers); the
#                 table step reads GGUF metadata sizes with LLAMA_SRC's gguf-py through it
#   TYPES         llama-quantize types made without an importance matrix (empty IMATRIX_TYPES or CROSS_TYPE
#                 skips those parts)
#   IMATRIX_TYPES types made with an importance matrix computed by llama-imatrix on CALIB
#   CALIB         calibration text for the importance matrix (default: TEXT itself, which favours the
#                 imatrix types: they have seen the text they are scored on); IMATRIX_CHUNKS limits
#                 the chunks of 512 tokens llama-imatrix reads (0 = all)
#   RECIPES       spool convert recipes, each optionally with class overrides (RECIPE/eN/aN/lN/xN/dN: see the
#                 loop below), bpwX for --target-bpw X, or bpw@TYPE for the size of llama.cpp's TYPE here
#                 (cbpwX, cbpw@TYPE: with --calibration CALIB, as llama-imatrix);
#                 SPOOL_CONVERT_FLAGS are added to every conversion
#   CHUNKS        windows of 512 tokens scored (0 = the whole text); CROSS_TYPE / CROSS_CHUNKS: the
#                 llama-perplexity cross-check (empty CROSS_TYPE skips it)
#   NAME          result file name (default: the model directory's name)
# Work files stay in build/quality/NAME (the GGUFs, the importance matrix, scores of unchanged files);
# delete it to start over.
# The MTP head of a checkpoint (mtp.* tensors) is left out on both sides: the table is about the main model.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
MODEL=$(realpath "${1:-build/models/spool-demo-moe}")
TEXT=$(realpath "${2:-tests/data/corpus/dev.txt}")
NAME=${NAME:-$(basename "$MODEL")}
LLAMA_SRC=${LLAMA_SRC:-/work/scratch/llama.cpp}
LLAMA_BIN=${LLAMA_BIN:-$LLAMA_SRC/build/bin}
PYTHON=${PYTHON:-/tmp/tvenv/bin/python}
TYPES=${TYPES:-"Q8_0 Q6_K Q5_K_M Q5_K_S Q4_K_M Q4_K_S IQ4_XS IQ4_NL Q3_K_L Q3_K_M Q3_K_S IQ3_S Q2_K"}
IMATRIX_TYPES=${IMATRIX_TYPES-"IQ3_XXS IQ2_M IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S"}
CALIB=$(realpath "${CALIB:-$TEXT}")
IMATRIX_CHUNKS=${IMATRIX_CHUNKS:-0}
RECIPES=${RECIPES:-"q4 tq3 tq3-g64 q2 tq3a-tqTe tq3a-tqTe-down4 tq3a-tqTe-down3 q8 q6 q5 q4-hi8 q4-hi6 q4-hi8-down6 q5-hi8 $(for t in $TYPES $IMATRIX_TYPES; do printf 'bpw@%s ' "$t"; done)"}
SPOOL_CONVERT_FLAGS=${SPOOL_CONVERT_FLAGS:-}
CHUNKS=${CHUNKS:-0}
CROSS_TYPE=${CROSS_TYPE-Q4_K_M}
CROSS_CHUNKS=${CROSS_CHUNKS:-20}
THREADS=${THREADS:-$(nproc)}
WORK=${WORK:-build/quality/$NAME}
OUT=bench/results/quality-$NAME.md
SPOOL=${SPOOL_BIN:-$PWD/build/spool}  # SPOOL_BIN: a copy, so a rebuild during the run does not mix builds

for t in llama-quantize llama-imatrix llama-perplexity; do
  [ -x "$LLAMA_BIN/$t" ] || { echo "quality.sh: no $LLAMA_BIN/$t (set LLAMA_BIN)" >&2; exit 1; }
done
[ -f "$LLAMA_SRC/convert_hf_to_gguf.py" ] || { echo "quality.sh: no convert_hf_to_gguf.py in $LLAMA_SRC (set LLAMA_SRC)" >&2; exit 1; }
[ -x "$SPOOL" ] || { echo "quality.sh: build spool first (scripts/setup.sh; cmake --build build)" >&2; exit 1; }
mkdir -p "$WORK" bench/results
ROWS=$WORK/rows.tsv
: > "$ROWS"

# The model without its MTP head: symlinked shards, an index and a config without mtp.*.
BASE=$WORK/base
rm -rf "$BASE" && mkdir -p "$BASE"
python3 - "$MODEL" "$BASE" <<'EOF'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
for f in os.listdir(src):
    if f.startswith("model-mtp") or f in ("config.json", "model.safetensors.index.json"):
        continue
    os.symlink(os.path.join(src, f), os.path.join(dst, f))
cfg = json.load(open(os.path.join(src, "config.json")))
for c in (cfg, cfg.get("text_config", {})):
    if "mtp_num_hidden_layers" in c:
        c["mtp_num_hidden_layers"] = 0
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
idx = os.path.join(src, "model.safetensors.index.json")
if os.path.exists(idx):
    j = json.load(open(idx))
    j["weight_map"] = {k: v for k, v in j["weight_map"].items() if not k.startswith("mtp.")}
    for f in set(j["weight_map"].values()):
        if not os.path.exists(os.path.join(dst, f)):
            sys.exit(f"quality.sh: {f} is named by the index but missing")
    json.dump(j, open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=2)
EOF
# Parameters = elements of every tensor of the base model (bits per weight = 8 * bytes / params).
PARAMS=$(python3 - "$BASE" <<'EOF'
import json, math, os, struct, sys
d = sys.argv[1]
idx = os.path.join(d, "model.safetensors.index.json")
files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else \
    [f for f in os.listdir(d) if f.endswith(".safetensors")]
n = 0
for f in files:
    with open(os.path.join(d, f), "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    n += sum(math.prod(v["shape"]) for k, v in h.items() if k != "__metadata__")
print(n)
EOF
)
size_of() { if [ -d "$1" ]; then du -cbL "$1"/*.safetensors | tail -1 | cut -f1; else stat -c %s "$1"; fi; }

# score TOOL LABEL PATH [spool flags...]: one row of the table (tab-separated) in $ROWS. A row is
# kept in $WORK/scores and reused while the file (a GGUF's size and mtime: made once per WORK; a spool
# directory's bytes: converted fresh every run, deterministic), TEXT and CHUNKS are the same; failures
# are not kept.
score() {
  local tool=$1 label=$2 path=$3; shift 3
  local j err=$WORK/last.err key
  local id
  if [ -d "$path" ]; then id=$(cat "$path"/*.safetensors | sha1sum); else id=$(stat -Lc '%s %Y' "$path"); fi
  key=$WORK/scores/$(printf '%s' "$tool $label $id $TEXT $CHUNKS $*" | sha1sum | cut -c1-16)
  if [ -s "$key" ]; then
    printf '%s\t%s\n' "$(cat "$key")" "$path" >> "$ROWS"
    echo "  $tool $label (kept): $(cut -f3- "$key" | tr '\t' ' ')"
    return 0
  fi
  if ! j=$("$SPOOL" perplexity --model "$path" -f "$TEXT" --chunks "$CHUNKS" -t "$THREADS" --kl-reference "$BASE" --json "$@" 2>"$err"); then
    echo "quality.sh: spool perplexity of $label failed: $(tail -1 "$err")" >&2
    printf '%s\t%s\t%s\tfailed: %s\n' "$tool" "$label" "$(size_of "$path")" "$(tail -1 "$err" | tr '\t' ' ')" >> "$ROWS"
    return 0
  fi
  local row
  row=$(python3 - "$tool" "$label" "$(size_of "$path")" "$j" <<'EOF'
import json, sys
tool, label, size, j = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
r = j["reference"]
print(f"{tool}\t{label}\t{size}\t{r['mean_kl']:.6f}\t{r['top1_agreement']:.6f}\t{j['ppl']:.4f}\t{r['ppl']:.4f}\t{j['tokens']}")
EOF
  )
  mkdir -p "$WORK/scores" && printf '%s\n' "$row" > "$key"
  printf '%s\t%s\n' "$row" "$path" >> "$ROWS"
  echo "  $tool $label: $(cut -f3- <<< "$row" | tr '\t' ' ')"
}

# llama.cpp: bf16 GGUF, importance matrix, every type.
GGUF_BF16=$WORK/bf16.gguf
if [ ! -s "$GGUF_BF16" ]; then
  echo "quality.sh: converting $MODEL to a bf16 GGUF with llama.cpp's converter"
  "$PYTHON" bench/gguf_convert.py "$LLAMA_SRC" "$BASE" "$GGUF_BF16" --no-mtp > "$WORK/convert.log" 2>&1 ||
    { tail -5 "$WORK/convert.log" >&2; exit 1; }
fi
IMATRIX=$WORK/imatrix.gguf
if [ -n "$IMATRIX_TYPES" ] && [ ! -s "$IMATRIX" ]; then
  echo "quality.sh: importance matrix from $CALIB"
  "$LLAMA_BIN/llama-imatrix" -m "$GGUF_BF16" -f "$CALIB" -o "$IMATRIX" -t "$THREADS" -c 512 --chunks "$((IMATRIX_CHUNKS > 0 ? IMATRIX_CHUNKS : -1))" > "$WORK/imatrix.log" 2>&1 ||
    { tail -5 "$WORK/imatrix.log" >&2; exit 1; }
fi
score bf16 "bf16 safetensors" "$BASE"
score llama.cpp "BF16 GGUF" "$GGUF_BF16" --act-bits 32
for t in $TYPES $IMATRIX_TYPES; do
  f=$WORK/$t.gguf
  extra=()
  case " $IMATRIX_TYPES " in *" $t "*) extra=(--imatrix "$IMATRIX") ;; esac
  if [ ! -s "$f" ]; then
    "$LLAMA_BIN/llama-quantize" "${extra[@]}" "$GGUF_BF16" "$f.part" "$t" "$THREADS" > "$WORK/quantize-$t.log" 2>&1 ||
      { echo "quality.sh: llama-quantize $t failed" >&2; tail -3 "$WORK/quantize-$t.log" >&2; exit 1; }
    mv "$f.part" "$f"
  fi
  score llama.cpp "$t${extra:+ (imatrix)}" "$f" --act-bits 32
done

# spool: every recipe, converted fresh from the bf16 model.
# An entry RECIPE/eN/aN/lN/xN/dN adds per-class overrides: --embed-bits, --attn-bits, --lm-head-bits,
# --expert-bits, --expert-down-bits N (any subset, in any order; e.g. q4-hi6/e4/l4).
for r in $RECIPES; do
  emb=()
  if [[ $r == bpw* || $r == cbpw* ]]; then
    # bpwX: spool convert --target-bpw X (allocated per matrix); bpw@TYPE: the bits per weight of
    # llama.cpp's TYPE file here (its tensor bytes over the parameters, less 0.1%): the same size.
    # cbpw...: the same with --calibration CALIB (the text llama-imatrix reads).
    cal=()
    if [[ $r == c* ]]; then cal=(--calibration "$CALIB" --calibration-tokens "$(( IMATRIX_CHUNKS > 0 ? IMATRIX_CHUNKS * 512 : 1 << 30 ))"); fi
    bpw=${r#*bpw}
    if [[ $bpw == @* ]]; then
      g=$WORK/${bpw#@}.gguf
      [ -s "$g" ] || { echo "quality.sh: $r needs ${bpw#@} in TYPES or IMATRIX_TYPES" >&2; exit 2; }
      bpw=$(GGUF_PY=$LLAMA_SRC/gguf-py "$PYTHON" -c "import sys; sys.path.insert(0, 'bench'); from quality_table import tensor_bytes; print(f'{0.999 * 8 * tensor_bytes(sys.argv[1]) / $PARAMS:.4f}')" "$g")
    fi
    d=$WORK/spool-${r//@/_}
    rm -rf "${d:?}"
    # shellcheck disable=SC2086
    "$SPOOL" convert --model "$BASE" --target-bpw "$bpw" "${cal[@]}" --out "$d" -t "$THREADS" $SPOOL_CONVERT_FLAGS > /dev/null 2> "$WORK/last.err" ||
      { echo "quality.sh: spool convert --target-bpw $bpw failed:" >&2; cat "$WORK/last.err" >&2; exit 1; }
    score spool "$r" "$d"
    continue
  fi
  IFS=/ read -r -a parts <<< "${r#*/}"
  if [ "$r" != "${r%%/*}" ]; then
    for p in "${parts[@]}"; do
      case "$p" in
        e*) emb+=(--embed-bits "${p#e}") ;; a*) emb+=(--attn-bits "${p#a}") ;; l*) emb+=(--lm-head-bits "${p#l}") ;;
        x*) emb+=(--expert-bits "${p#x}") ;; d*) emb+=(--expert-down-bits "${p#d}") ;;
        *) echo "quality.sh: unknown override '$p' in $r (e, a, l, x, d)" >&2; exit 2 ;;
      esac
    done
  fi
  rm -rf "${WORK:?}/spool-${r//\//_}"
  # shellcheck disable=SC2086
  "$SPOOL" convert --model "$BASE" --recipe "${r%%/*}" "${emb[@]}" --out "$WORK/spool-${r//\//_}" -t "$THREADS" $SPOOL_CONVERT_FLAGS > /dev/null 2> "$WORK/last.err" ||
    { echo "quality.sh: spool convert $r failed:" >&2; cat "$WORK/last.err" >&2; exit 1; }
  score spool "$r" "$WORK/spool-${r//\//_}"
done

# Cross-check on llama-perplexity's definition (n_ctx 512, second halves): its KLD of CROSS_TYPE
# against its own bf16 logits, and spool's on the same file and chunks (act-bits 8 = llama.cpp's
# Q8 activations, and 32). llama.cpp runs with --no-repack: its AMX repacked path crashed
# (SIGSEGV in ggml_backend_amx_mul_mat) on the Sapphire-Rapids-class dev VM.
CROSS=""
if [ -n "$CROSS_TYPE" ]; then
  base_kld=$WORK/bf16.kld
  "$LLAMA_BIN/llama-perplexity" -m "$GGUF_BF16" -f "$TEXT" -c 512 --chunks "$CROSS_CHUNKS" -t "$THREADS" --no-repack \
    --kl-divergence-base "$base_kld" > "$WORK/cross-base.log" 2>&1 || { tail -5 "$WORK/cross-base.log" >&2; exit 1; }
  "$LLAMA_BIN/llama-perplexity" -m "$WORK/$CROSS_TYPE.gguf" -f "$TEXT" -c 512 --chunks "$CROSS_CHUNKS" -t "$THREADS" --no-repack \
    --kl-divergence-base "$base_kld" --kl-divergence > "$WORK/cross.log" 2>&1 || { tail -5 "$WORK/cross.log" >&2; exit 1; }
  llama_kld=$(grep -E '^Mean +KLD:' "$WORK/cross.log" | awk '{print $3, $4, $5}')
  llama_top=$(grep -E '^Same top p:' "$WORK/cross.log" | awk '{print $4, $5, $6}')
  cross_spool() {
    "$SPOOL" perplexity --llama-compat -c 512 --chunks "$CROSS_CHUNKS" -t "$THREADS" --model "$WORK/$CROSS_TYPE.gguf" -f "$TEXT" \
      --kl-reference "$BASE" "$@" 2> "$WORK/cross-spool.err" > "$WORK/cross-spool.log" ||
      { echo "quality.sh: spool perplexity --llama-compat on $CROSS_TYPE failed: $(tail -1 "$WORK/cross-spool.err")" >&2; return 1; }
    printf 'Mean KLD %s, same top p %s %% ' "$(sed -n 's/^Mean KLD: //p' "$WORK/cross-spool.log")" \
      "$(sed -n 's/^Same top p: \([0-9.]*\) %$/\1/p' "$WORK/cross-spool.log")"
  }
  spool8=$(cross_spool) || spool8="failed (see above); "
  spool32=$(cross_spool --act-bits 32) || spool32="failed (see above); "
  CROSS="$CROSS_TYPE on llama-perplexity's definition ($CROSS_CHUNKS chunks of 512, second halves): llama-perplexity --kl-divergence
against its BF16 GGUF: Mean KLD $llama_kld, same top p $llama_top %; spool perplexity --llama-compat --kl-reference against the bf16
safetensors: $spool8(8-bit activations, as llama.cpp's CPU path) and $spool32(--act-bits 32)."
fi

GGUF_PY=$LLAMA_SRC/gguf-py "$PYTHON" bench/quality_table.py "$ROWS" "$PARAMS" "$OUT" "$NAME" "$TEXT" "$CHUNKS" "$CALIB" "$CROSS"
if command -v gnuplot > /dev/null; then
  gnuplot <<EOF
set terminal pngcairo size 1200,520 font ",10" noenhanced
set output "bench/results/quality-$NAME.png"
set multiplot layout 1,2 title "$NAME: quality per byte (KL to bf16 on $(basename "$TEXT"); * = imatrix)"
set xlabel "bits per weight (tensor bytes)"; set grid
set ylabel "mean KL(bf16 || quantized), nats"; set logscale y
plot "$WORK/plot.dat" using (\$1==1?\$2:1/0):3 with points pt 7 title "llama.cpp", \
     "" using (\$1==1?\$2:1/0):3:5 with labels offset 0,0.8 font ",7" notitle, \
     "" using (\$1==0?\$2:1/0):3 with points pt 5 title "spool", \
     "" using (\$1==0?\$2:1/0):3:5 with labels offset 0,-0.8 font ",7" notitle
unset logscale y; set ylabel "top-1 agreement with bf16, %"
plot "$WORK/plot.dat" using (\$1==1?\$2:1/0):4 with points pt 7 title "llama.cpp", \
     "" using (\$1==0?\$2:1/0):4 with points pt 5 title "spool"
unset multiplot
EOF
  echo "quality.sh: wrote bench/results/quality-$NAME.png"
else
  echo "quality.sh: no gnuplot (apt-get install gnuplot-nox): the table only, no PNG"
fi
