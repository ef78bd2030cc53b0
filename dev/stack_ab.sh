#!/usr/bin/env bash
# The three GPT-2 experiments together (emb-dwte-tiles, ln-bwd-prefetch's xdy patch,
# attn-bias-sums) against main, in one GPU call: one build each, every test the three patches
# touch, GPT-2's first 50 losses, then GPT-2's step and the small GPT's, builds alternating. Each
# patch alone moves GPT-2's step by less than run-to-run spread (about 0.2 ms of 29.3 each);
# together they should show (README.md). From the repository root, with .data carried:
#   OUT=... bash dev/stack_ab.sh                    (about 8 minutes on an H200)
cd "$(dirname "$0")/.."
. dev/scratch_tree.sh /tmp/stack-ab
rm -rf /tmp/stackbin
tests=(gpu_test_embedding gpu_test_layernorm gpu_test_attention gpu_test_train test_attention)
# the new test cases go into both builds: main must pass them too
for p in emb-dwte-tiles/test_bench ln-bwd-prefetch/test_rows; do patch -s -p1 < dev/$p.patch; done
keep() {  # variant
  mkdir -p /tmp/stackbin/$1 && cp build/nanotrain /tmp/stackbin/$1/
}
scripts/build.sh build -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
keep main
for t in gpu_test_embedding gpu_test_layernorm; do
  build/tests/$t > "$out/main_$t.log" 2>&1
  echo "main: $t rc=$? $(grep -E '^[0-9]+ passed' "$out/main_$t.log")"
done | tee "$out/ab.txt"
variants=(main)
for p in emb-dwte-tiles/dwte_tiles ln-bwd-prefetch/ln_bwd_prefetch_xdy attn-bias-sums/attn_bias_sums; do
  patch -s -p1 < dev/$p.patch || { echo "stack: $p does not apply"; exit 1; }
done
if ninja -C build nanotrain "${tests[@]/#/tests/}" > "$out/build_stack.log" 2>&1; then
  keep stack && variants+=(stack)
  for t in "${tests[@]}"; do
    build/tests/$t > "$out/stack_$t.log" 2>&1
    echo "stack: $t rc=$? $(grep -E '^[0-9]+ passed|^measured.*bf16' "$out/stack_$t.log" | tr '\n' ' ')"
  done | tee -a "$out/ab.txt"
else
  echo "stack: build failed"; tail -20 "$out/build_stack.log"
fi
for v in "${variants[@]}"; do
  AUTOTUNE=0 gpt_run /tmp/stackbin/$v/nanotrain /tmp/l --preset gpt2 --batch-size 16 --max-iters 50 --log-interval 1
  l=$(losses /tmp/l/metrics.jsonl)
  [[ -n $l ]] && l=$(awk '{print "first", $1, "last", $NF, "(" NF " steps)"}' <<< "$l")
  echo "GPT-2 losses $v: ${l:-none (the run failed)}"
done | tee -a "$out/ab.txt"
rounds 3 GPT-2 /tmp/stackbin --preset gpt2 --batch-size 16 --max-iters 120 --log-interval 10 |
  tee -a "$out/ab.txt"
rounds 3 "small GPT" /tmp/stackbin --max-iters 400 --log-interval 25 | tee -a "$out/ab.txt"
