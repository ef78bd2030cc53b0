#!/usr/bin/env bash
# A GPU session's A/B of two trees in one call: the current tree (build/) against another
# (default: the source archive .data/old.tar, built in /tmp/old/build), on the same GPU.
#   scripts/gpu_compare.sh [tests] [speed] [losses]     logs under $OUT
#   tests   ctest -L gpu on the current tree
#   speed   shakespeare_char step ms, GPT-2 124M tokens/s, CNN images/s: old and new
#           interleaved over rounds, each figure the median of the log windows after warm-up
#   losses  the first 50 losses of the same seed and config, old against new (bit-identical?),
#           without dropout (the attention mask rule changed) and with cuBLASLt's first
#           heuristic choice (no autotuning, whose timed pick can differ between runs)
# Data: .data/tinyshakespeare.txt and .data/fashion-mnist/*.gz (git-ignored; carry .data).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/nt-out}
mkdir -p "$out"
export NT_DATA_DIR="$PWD/.data" NT_FASHION_DIR="$PWD/.data/fashion-mnist"
old=/tmp/old
modes="${*:-tests speed losses}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$out/env.txt" 2>&1
mkdir -p "$old" && tar -xf .data/old.tar -C "$old"
(scripts/build.sh build -DNT_CUDA_ARCHS=90a > "$out/build.log" 2>&1; echo "new build rc=$?") &
(cd "$old" && scripts/build.sh build -DNT_CUDA_ARCHS=90a > "$out/build_old.log" 2>&1; echo "old build rc=$?") &
wait
[[ -x build/nanotrain ]] || { grep -B2 -A8 -m5 "error" "$out/build.log"; exit 1; }

if [[ " $modes " == *" tests "* ]]; then
  (cd build && ctest -L gpu --output-on-failure --timeout 400 -j2) > "$out/ctest_gpu.log" 2>&1
  grep -E "tests passed|\*\*\*Failed|Timeout|tests failed" "$out/ctest_gpu.log" | tail -12
fi

# median step ms of the log windows after the first two (metrics.jsonl)
med() { python3 - "$1" <<'PY'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l or 'step_ms' in l]
ms = [x["step_ms"] for x in r if x.get("step_ms") is not None and x.get("kind", "train") == "train"][2:]
ips = [v for x in r if x.get("kind", "train") == "train" for k, v in x.items() if k.endswith("_per_sec") and v is not None][2:]
print("%.3f ms [%.3f-%.3f]  %.0f items/s  (n=%d)" % (statistics.median(ms), min(ms), max(ms), statistics.median(ips), len(ms)) if ms else "none")
PY
}
if [[ " $modes " == *" speed "* ]]; then
  for round in 1 2; do
    for side in new old; do
      b=build; [[ $side == old ]] && b=$old/build
      d=$out/speed_$side$round; rm -rf /tmp/$side$round; mkdir -p /tmp/$side$round
      "$b/nanotrain" gpt --device cuda --dtype bf16 --max-iters 300 --eval-interval 0 --log-interval 25 \
        --no-progress --out-dir /tmp/$side$round/char > /dev/null 2>&1
      "$b/nanotrain" gpt --device cuda --preset gpt2 --batch-size 16 --dtype bf16 --max-iters 120 \
        --eval-interval 0 --log-interval 10 --no-progress --out-dir /tmp/$side$round/gpt2 > /dev/null 2>&1
      "$b/nanotrain" cnn --device cuda --dtype fp16 --batch-size 256 --max-iters 600 --log-interval 50 \
        --no-progress --out-dir /tmp/$side$round/cnn > /dev/null 2>&1
      for w in char gpt2 cnn; do echo "round $round $side $w: $(med /tmp/$side$round/$w/metrics.jsonl)"; done
    done
  done | tee "$out/speed.txt"
fi
if [[ " $modes " == *" losses "* ]]; then
  for side in new old; do
    b=build; [[ $side == old ]] && b=$old/build
    for dt in bf16 fp16; do
      NT_GEMM_AUTOTUNE=0 NT_GEMM_SEARCH=0 \
      "$b/nanotrain" gpt --device cuda --dtype $dt --dropout 0 --max-iters 50 --eval-interval 0 --log-interval 1 \
        --no-progress --out-dir /tmp/loss_${side}_$dt > /dev/null 2>&1
      python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if 'eval' not in l))" \
        /tmp/loss_${side}_$dt/metrics.jsonl > "$out/losses_${side}_$dt.txt"
    done
  done
  for dt in bf16 fp16; do
    cmp -s "$out/losses_new_$dt.txt" "$out/losses_old_$dt.txt" && echo "losses $dt: identical (50 steps)" ||
      { echo "losses $dt: DIFFER"; head -c 300 "$out/losses_new_$dt.txt"; echo; head -c 300 "$out/losses_old_$dt.txt"; echo; }
  done | tee "$out/losses.txt"
fi
exit 0
