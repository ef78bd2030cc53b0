#!/usr/bin/env bash
# The LayerNorm backward's register kernel with the next row's loads issued before this row's
# work (README.md), against main, in one GPU call. From the repository root, with .data carried:
#   OUT=... bash dev/ln-bwd-prefetch/ab.sh          (about 7 minutes on an H200)
# Builds main in a copy of the tree (this one is never patched) with test_rows.patch's cases,
# then each kernel patch in turn (only ops/layernorm.cu recompiles), keeping each variant's
# binaries. Then: gpu_test_layernorm per variant; the first 50 losses of the small GPT in bf16 and fp16 (no dropout, no GEMM
# autotuning: the patches change no arithmetic, so they must equal main's bit for bit);
# bench_memops' LayerNorm backward rows; the small GPT's step (3 rounds) and GPT-2's (2 rounds),
# variants alternating, each the median of the log windows after the first two.
cd "$(dirname "$0")/../.."
. dev/scratch_tree.sh /tmp/ln-ab
rm -rf /tmp/lnbin
patch -s -p1 < dev/ln-bwd-prefetch/test_rows.patch   # every variant, main included, runs the new cases
keep() {  # variant: copy the binaries it needs
  mkdir -p /tmp/lnbin/$1 && cp build/nanotrain build/bench/bench_memops build/tests/gpu_test_layernorm /tmp/lnbin/$1/
}
scripts/build.sh build -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
keep main
variants=(main)
for p in ln_bwd_prefetch ln_bwd_prefetch_xdy; do
  patch -s -p1 < dev/ln-bwd-prefetch/$p.patch
  if ninja -C build nanotrain bench/bench_memops tests/gpu_test_layernorm > "$out/build_$p.log" 2>&1; then
    keep $p && variants+=($p)
  else
    echo "$p: build failed"
  fi
  patch -s -p1 -R < dev/ln-bwd-prefetch/$p.patch
done
for v in "${variants[@]}"; do
  /tmp/lnbin/$v/gpu_test_layernorm > "$out/test_$v.log" 2>&1
  echo "$v: gpu_test_layernorm rc=$? $(grep -E 'passed|FAIL' "$out/test_$v.log" | tail -1)"
  for dt in bf16 fp16; do
    rm -rf /tmp/l && NT_GEMM_AUTOTUNE=0 NT_GEMM_SEARCH=0 /tmp/lnbin/$v/nanotrain gpt --device cuda --dtype $dt \
      --dropout 0 --max-iters 50 --eval-interval 0 --log-interval 1 --no-progress --out-dir /tmp/l > /dev/null 2>&1
    losses /tmp/l/metrics.jsonl > "$out/losses_${v}_$dt.txt"
    [[ $v == main || ! -s $out/losses_main_$dt.txt ]] || { cmp -s "$out/losses_${v}_$dt.txt" "$out/losses_main_$dt.txt" &&
      echo "  $dt losses: identical to main's (50 steps)" || echo "  $dt losses: DIFFER from main's"; }
  done
done | tee "$out/ab.txt"
for round in 1 2 3; do
  for v in "${variants[@]}"; do
    echo "memops round $round $v: $(/tmp/lnbin/$v/bench_memops --repeats 50 | grep '^RESULT ln_bwd' | awk '{printf "%sx%s %s us; ", $3, $4, $7}')"
  done
done | tee -a "$out/ab.txt"
rounds 3 "small GPT" /tmp/lnbin --max-iters 400 --log-interval 25 | tee -a "$out/ab.txt"
rounds 2 GPT-2 /tmp/lnbin --preset gpt2 --batch-size 16 --max-iters 120 --log-interval 10 |
  tee -a "$out/ab.txt"
