#!/usr/bin/env bash
# c_attn's bias gradient summed by the attention backward from the tiles it writes (README.md),
# against main, in one GPU call. From the repository root, with .data carried:
#   OUT=... bash dev/attn-bias-sums/ab.sh           (about 7 minutes on an H200)
# Builds main in a copy of the tree (this one is never patched), keeps its binaries, applies
# attn_bias_sums.patch (the option, the kernels, the model's use and the tests) and rebuilds.
# Then: test_attention, gpu_test_attention (the bias sums on every path: its "measured" line
# gives the worst error, from which the bound is set to twice) and gpu_test_train for the patch;
# the first 50 losses of the small GPT (bf16, dropout 0) and GPT-2 (bf16) from each build, no
# GEMM autotuning (the bias gradient is summed in another order, so the losses may differ in
# the last bits: the largest relative difference is reported); the small GPT's step and
# GPT-2's, three rounds each, builds alternating, each the median of the log windows after the
# first two.
cd "$(dirname "$0")/../.."
. dev/scratch_tree.sh /tmp/bias-ab
rm -rf /tmp/biasbin
keep() {  # variant: copy the binaries it needs
  mkdir -p /tmp/biasbin/$1 && cp build/nanotrain /tmp/biasbin/$1/
}
scripts/build.sh build -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
keep main
variants=(main)
patch -s -p1 < dev/attn-bias-sums/attn_bias_sums.patch
if ninja -C build nanotrain tests/test_attention tests/gpu_test_attention tests/gpu_test_train \
     > "$out/build_sums.log" 2>&1; then
  keep sums && variants+=(sums)
  for t in test_attention gpu_test_attention gpu_test_train; do
    build/tests/$t > "$out/$t.log" 2>&1
    echo "sums: $t rc=$? $(grep -E '^[0-9]+ passed|^measured.*bf16|bias sums, layout 0' "$out/$t.log" | tr '\n' ' ')"
  done | tee "$out/ab.txt"
else
  echo "sums: build failed"; tail -20 "$out/build_sums.log"
fi
for v in "${variants[@]}"; do
  AUTOTUNE=0 gpt_run /tmp/biasbin/$v/nanotrain /tmp/l --dropout 0 --max-iters 50 --log-interval 1
  losses /tmp/l/metrics.jsonl > "$out/losses_small_$v.txt"
  AUTOTUNE=0 gpt_run /tmp/biasbin/$v/nanotrain /tmp/l --preset gpt2 --batch-size 16 --max-iters 50 --log-interval 1
  losses /tmp/l/metrics.jsonl > "$out/losses_gpt2_$v.txt"
done
for m in small gpt2; do
  python3 - "$out/losses_${m}_main.txt" "$out/losses_${m}_sums.txt" "$m" <<'PY'
import sys
try:
    a, b = (list(map(float, open(f).read().split())) for f in sys.argv[1:3])
except OSError:
    a, b = [], []
if not a or len(a) != len(b):
    print("%s losses: a run failed (%d against %d)" % (sys.argv[3], len(a), len(b)))
else:
    d = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print("%s losses over %d steps: largest relative difference %.3g (first %.6f / %.6f, last %.6f / %.6f)"
          % (sys.argv[3], len(a), d, a[0], b[0], a[-1], b[-1]))
PY
done | tee -a "$out/ab.txt"
rounds 3 "small GPT" /tmp/biasbin --max-iters 400 --log-interval 25 | tee -a "$out/ab.txt"
rounds 3 GPT-2 /tmp/biasbin --preset gpt2 --batch-size 16 --max-iters 120 --log-interval 10 |
  tee -a "$out/ab.txt"
