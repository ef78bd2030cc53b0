#!/usr/bin/env bash
# The embedding's dwte for a large vocabulary by tiles of sorted ids (README.md) against main, in
# one GPU call. From the repository root, with .data carried:
#   OUT=... bash dev/emb-dwte-tiles/ab.sh           (about 5 minutes on an H200)
# Builds main with test_bench.patch (the new gpu_test_embedding cases and bench_memops' emb_bwd
# row) in a copy of the tree, then the same with dwte_tiles.patch, keeping each one's binaries.
# Then, per variant: gpu_test_embedding; bench_memops' emb_bwd row (three rounds, alternating);
# GPT-2's first 50 losses (bf16, no GEMM autotuning; the tiles sum runs that cross a tile in
# another order, so these may differ in the last bits: reported, not required); GPT-2's step
# (three rounds, alternating; the median of the log windows after the first two).
cd "$(dirname "$0")/../.."
. dev/scratch_tree.sh /tmp/emb-ab
rm -rf /tmp/embbin
patch -s -p1 < dev/emb-dwte-tiles/test_bench.patch
keep() {  # variant
  mkdir -p /tmp/embbin/$1 && cp build/nanotrain build/bench/bench_memops build/tests/gpu_test_embedding /tmp/embbin/$1/
}
scripts/build.sh build -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
keep main
variants=(main)
patch -s -p1 < dev/emb-dwte-tiles/dwte_tiles.patch
if ninja -C build nanotrain bench/bench_memops tests/gpu_test_embedding > "$out/build_tiles.log" 2>&1; then
  keep tiles && variants+=(tiles)
else
  echo "tiles: build failed"; tail -20 "$out/build_tiles.log"
fi
gpt2=(--preset gpt2 --batch-size 16)
for v in "${variants[@]}"; do
  /tmp/embbin/$v/gpu_test_embedding > "$out/test_$v.log" 2>&1
  echo "$v: gpu_test_embedding rc=$? $(grep -E 'passed|FAIL' "$out/test_$v.log" | tail -3 | tr '\n' ' ')"
  AUTOTUNE=0 gpt_run /tmp/embbin/$v/nanotrain /tmp/l "${gpt2[@]}" --max-iters 50 --log-interval 1
  losses /tmp/l/metrics.jsonl > "$out/losses_$v.txt"
done | tee "$out/ab.txt"
[[ ${#variants[@]} == 2 && -s $out/losses_main.txt ]] && { cmp -s "$out/losses_main.txt" "$out/losses_tiles.txt" &&
  echo "GPT-2 losses: identical over 50 steps" || echo "GPT-2 losses: differ"; } | tee -a "$out/ab.txt"
for round in 1 2 3; do
  for v in "${variants[@]}"; do
    echo "memops round $round $v: $(/tmp/embbin/$v/bench_memops --repeats 50 | grep '^RESULT emb_bwd' | awk '{printf "%sx%s %s us %s GB/s", $3, $4, $7, $8}')"
  done
done | tee -a "$out/ab.txt"
rounds 3 GPT-2 /tmp/embbin "${gpt2[@]}" --max-iters 120 --log-interval 10 | tee -a "$out/ab.txt"
