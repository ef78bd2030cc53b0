#!/usr/bin/env bash
# Do the embedding's PDL launches (README.md) keep the CPU's losses, and are they faster? For a
# GPU call, from the repository root:
#   OUT=... bash dev/pdl-embedding/bisect.sh [SET ...]       (about 3 minutes on an H200)
# A SET is a patch name or names joined by "+" (default: embedding_backward and
# embedding_forward+embedding_backward). Builds main in build-pdl (a copy of the tree under /tmp,
# so the patches never touch this one), then for each set: applies it, rebuilds, trains
# gpu_test_train's fp32 dropout config three times as a CUDA graph and twice eagerly, and
# compares every loss with the CPU's (main's CPU path, the reference; all losses go to
# $OUT/losses.txt, to tell a race, different each run, from a fixed difference); then times the
# small GPT's step with each set that kept the CPU's losses against main, three rounds.
cd "$(dirname "$0")/../.."
. dev/scratch_tree.sh /tmp/pdl-embedding
(scripts/build.sh build-pdl -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 &&
 cp build-pdl/nanotrain /tmp/nanotrain-main) || { tail -20 "$out/build.log"; exit 1; }
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
sets=("$@")
[[ ${#sets[@]} -gt 0 ]] || sets=(embedding_backward embedding_forward+embedding_backward)
for p in "${sets[@]}"; do
  IFS=+ read -ra parts <<< "$p"
  for q in "${parts[@]}"; do patch -s -p1 < dev/pdl-embedding/$q.patch; done
  if ninja -C build-pdl nanotrain > "$out/build_$p.log" 2>&1; then
    r=$(check $p); echo "$r"
    if [[ $r == "$p: 0 of"* ]]; then
      for round in 1 2 3; do echo "  small GPT, round $round: $p $(speed ./build-pdl/nanotrain), main $(speed /tmp/nanotrain-main)"; done
    fi
  else
    echo "$p: build failed"
  fi
  for ((k = ${#parts[@]} - 1; k >= 0; k--)); do patch -s -p1 -R < dev/pdl-embedding/${parts[k]}.patch; done
done | tee -a "$out/bisect.txt"
