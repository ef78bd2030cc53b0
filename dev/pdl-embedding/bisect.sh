#!/usr/bin/env bash
# Which half of the embedding's PDL launches races (README.md), and does a kernel launched with
# PDL see the data of a copy issued just before it? For a GPU call, from the repository root:
#   OUT=... bash dev/pdl-embedding/bisect.sh        (about 3 minutes on an H200)
# Builds main in build-pdl (a copy of the tree under /tmp, so the patches never touch this one)
# and the probe memcpy_pdl.cu, runs the probe, then for each patch: applies it, rebuilds, trains
# gpu_test_train's fp32 dropout config three times as a CUDA graph and twice eagerly, and
# compares every loss with the CPU's (main's CPU path, the reference; all losses go to
# $OUT/losses.txt, to tell a race, different each run, from a fixed difference); then times the
# small GPT's step with each patch that kept the CPU's losses against main, three rounds.
cd "$(dirname "$0")/../.."
. dev/scratch_tree.sh /tmp/pdl-embedding
(scripts/build.sh build-pdl -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 &&
 cp build-pdl/nanotrain /tmp/nanotrain-main) || { tail -20 "$out/build.log"; exit 1; }
nvcc -O2 -arch=sm_90a -o /tmp/memcpy_pdl dev/pdl-embedding/memcpy_pdl.cu && /tmp/memcpy_pdl | tee "$out/memcpy_pdl.txt"
A="gpt --dtype fp32 --data synthetic --n-layer 2 --n-head 2 --n-embd 128 --block-size 128
   --vocab-size 65 --batch-size 8 --max-iters 10 --warmup-iters 2 --lr-decay-iters 10
   --eval-interval 0 --log-interval 1 --dropout 0.2 --no-progress"
rm -rf /tmp/ref && /tmp/nanotrain-main $A --device cpu --out-dir /tmp/ref > /dev/null 2>&1
ref=$(losses /tmp/ref/metrics.jsonl)
[[ -n $ref ]] || { echo "the CPU reference run failed"; exit 1; }
echo "cpu: $ref" > "$out/losses.txt"
check() {  # label: the runs of build-pdl/nanotrain as it stands
  local bad=0 l
  for mode in cuda-graph cuda-graph cuda-graph no-cuda-graph no-cuda-graph; do
    rm -rf /tmp/r && ./build-pdl/nanotrain $A --device cuda --$mode --out-dir /tmp/r > /dev/null 2>&1
    l=$(losses /tmp/r/metrics.jsonl)
    echo "$1 $mode: $l" >> "$out/losses.txt"
    [[ "$l" == "$ref" ]] || bad=$((bad + 1))
  done
  echo "$1: $bad of 5 fp32 dropout runs (3 graph, 2 eager) off the CPU's losses"
}
speed() {  # binary
  rm -rf /tmp/c && $1 gpt --device cuda --dtype bf16 --max-iters 400 --eval-interval 0 \
    --log-interval 25 --no-progress --out-dir /tmp/c > /dev/null 2>&1
  med /tmp/c/metrics.jsonl
}
check main | tee "$out/bisect.txt"
for p in embedding_forward embedding_backward; do
  patch -s -p1 < dev/pdl-embedding/$p.patch
  if ninja -C build-pdl nanotrain > "$out/build_$p.log" 2>&1; then
    r=$(check $p); echo "$r"
    if [[ $r == "$p: 0 of"* ]]; then
      for round in 1 2 3; do echo "  small GPT, round $round: $p $(speed ./build-pdl/nanotrain), main $(speed /tmp/nanotrain-main)"; done
    fi
  else
    echo "$p: build failed"
  fi
  patch -s -p1 -R < dev/pdl-embedding/$p.patch
done | tee -a "$out/bisect.txt"
