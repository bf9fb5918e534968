#!/usr/bin/env bash
# Packs tests/data and the demo model for the repository (run from the repository root after
# adding or regenerating fixtures; the build unpacks them, cmake/data.cmake):
#  - solid archives tests/data/packs/NAME.tar.xz for files that repeat each other's bytes (a fixture
#    checkpoint and the same weights as an F32 GGUF, a checkpoint and its fused-experts copy):
#    together they compress to little more than one of them. Member paths are relative to tests/data.
#  - every other *.xz recompressed with LZMA2 literal/position contexts that match its data
#    (lp=2,pb=2 for f32 tensors, lp=1,pb=1 for the demo's bf16 shards): 5-9% smaller than xz -9e,
#    and plain xz decompresses them.
# Inputs are taken from the build tree's unpacked copies (BUILD_DIR, default build) when a member
# is not in the source tree as NAME or NAME.xz.
set -euo pipefail
build=${BUILD_DIR:-build}
data=tests/data
f32='--lzma2=preset=9e,lc=2,lp=2,pb=2'
bf16='--lzma2=preset=9e,lc=3,lp=1,pb=1'

pack() {  # pack NAME MEMBER...: tests/data/packs/NAME.tar.xz from the members (paths relative to tests/data)
  local name=$1; shift
  local tmp; tmp=$(mktemp -d)
  for m in "$@"; do
    mkdir -p "$tmp/$(dirname "$m")"
    if [ -f "$data/$m.xz" ]; then xz -dc "$data/$m.xz" > "$tmp/$m"
    elif [ -f "$data/$m" ]; then cp "$data/$m" "$tmp/$m"
    else cp "$build/$data/$m" "$tmp/$m"; fi
  done
  mkdir -p "$data/packs"
  tar -C "$tmp" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - "$@" | xz -T1 $f32 > "$data/packs/$name.tar.xz"
  for m in "$@"; do rm -f "$data/$m.xz" "$data/$m"; done
  rm -rf "$tmp"
  echo "packs/$name.tar.xz $(stat -c%s "$data/packs/$name.tar.xz")"
}

recompress() {  # recompress FILE.xz OPTS: keeps the smaller of the two
  local f=$1 opts=$2
  xz -dc "$f" | xz -T1 $opts > "$f.new"
  if [ "$(stat -c%s "$f.new")" -lt "$(stat -c%s "$f")" ]; then mv "$f.new" "$f"; else rm "$f.new"; fi
}

for n in qwen3_moe qwen3_next qwen3_5_moe_text olmoe mixtral glm4_moe minimax_m2 deepseek_v2_lite deepseek_v3 gemma4_text_moe; do
  [ -f "$data/packs/$n.tar.xz" ] || pack "$n" "models/$n/model.safetensors" "gguf/models/$n.f32.gguf"
done
[ -f "$data/packs/qwen3_5_moe_vl.tar.xz" ] || \
  pack qwen3_5_moe_vl models/qwen3_5_moe_vl/model.safetensors models/qwen3_5_moe_vl_fused/model.safetensors
find "$data" -name '*.xz' ! -name '*.tar.xz' | sort | while read -r f; do recompress "$f" "$f32"; done
for f in models/spool-demo-moe/*.safetensors.xz; do recompress "$f" "$bf16"; done
[ -f models/spool-demo-moe/tokenizer.json ] && xz -9e -T1 models/spool-demo-moe/tokenizer.json
du -cb $(find tests/data models -type f) | tail -1
