#!/usr/bin/env bash
# Which of the three PDL launches in this folder races (README.md)? For a GPU call, from the
# repository root:  OUT=... bash dev/pdl-more/bisect.sh      (about 3 minutes on an H200)
# Builds main once, then for each patch alone and for all three: applies it, rebuilds (one or
# three kernel files), trains the fp32 dropout config of gpu_test_train's failing case three
# times as a CUDA graph and once eagerly, and compares every loss with the CPU's (main's CPU
# path, the reference); then takes the patch back out. Last, the small GPT's step time with each
# patch that kept the CPU's losses, against main.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/nt-out}
mkdir -p "$out"
B=build-pdl
A="gpt --dtype fp32 --data synthetic --n-layer 2 --n-head 2 --n-embd 128 --block-size 128
   --vocab-size 65 --batch-size 8 --max-iters 10 --warmup-iters 2 --lr-decay-iters 10
   --eval-interval 0 --log-interval 1 --dropout 0.2 --no-progress"
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1"; }
apply() {  # [-R] file: with git, or with patch(1) where the tree has no usable git directory
  git apply "$@" 2>/dev/null && return
  if [[ $1 == -R ]]; then patch -s -p1 -R < "$2"; else patch -s -p1 < "$1"; fi
}
scripts/build.sh $B -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
rm -rf /tmp/ref && ./$B/nanotrain $A --device cpu --out-dir /tmp/ref > /dev/null 2>&1
ref=$(losses /tmp/ref/metrics.jsonl)
check() {  # label
  local bad=0
  for mode in cuda-graph cuda-graph cuda-graph no-cuda-graph; do
    rm -rf /tmp/r && ./$B/nanotrain $A --device cuda --$mode --out-dir /tmp/r > /dev/null 2>&1
    [[ "$(losses /tmp/r/metrics.jsonl)" == "$ref" ]] || bad=$((bad + 1))
  done
  echo "$1: $bad of 4 fp32 dropout runs off the CPU's losses"
}
speed() {  # label
  rm -rf /tmp/c && NT_DATA_DIR=${NT_DATA_DIR:-$PWD/.data} ./$B/nanotrain gpt --device cuda --dtype bf16 \
    --max-iters 400 --eval-interval 0 --log-interval 25 --no-progress --out-dir /tmp/c > /dev/null 2>&1
  python3 -c "
import json, statistics, sys
ms = [json.loads(l).get('step_ms') for l in open('/tmp/c/metrics.jsonl')]
ms = [m for m in ms if m is not None][2:]
print('%s: small GPT %.3f ms a step (median of %d windows)' % (sys.argv[1], statistics.median(ms), len(ms)))" "$1"
}
check main
for p in cross_entropy cross_entropy_wait_only embedding adamw all; do
  files=(dev/pdl-more/$p.patch); [[ $p == all ]] && files=(dev/pdl-more/{cross_entropy,embedding,adamw}.patch)
  for f in "${files[@]}"; do apply "$f"; done
  ninja -C $B nanotrain > "$out/build_$p.log" 2>&1 || echo "$p: build failed"
  r=$(check "$p"); echo "$r"
  for f in "${files[@]}"; do apply -R "$f"; done
done | tee "$out/bisect.txt"
ninja -C $B nanotrain > /dev/null 2>&1
for round in 1 2 3; do
  speed main
  for p in $(grep -o '^[a-z_]*: 0 of 4' "$out/bisect.txt" | cut -d: -f1 | grep -vx main); do
    files=(dev/pdl-more/$p.patch); [[ $p == all ]] && files=(dev/pdl-more/{cross_entropy,embedding,adamw}.patch)
    for f in "${files[@]}"; do apply "$f"; done
    ninja -C $B nanotrain > /dev/null 2>&1 && speed "$p"
    for f in "${files[@]}"; do apply -R "$f"; done
    ninja -C $B nanotrain > /dev/null 2>&1
  done
done | tee "$out/speed.txt"
