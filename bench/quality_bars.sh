#!/usr/bin/env bash
# The issue's quality bars on the GPU, one line each at the end:
#   GPT shakespeare_char (nanoGPT config), 5000 iterations, bf16:        val loss <= 1.50
#   the same with fp16 + the dynamic loss scaler:                         val loss <= 1.52
#   CNN on Fashion-MNIST, 10 epochs, fp16 + loss scaler:                  test accuracy >= 92.5%
#     (also with --augment, random crop + flip, as a second data point)
#   NT_DATA_DIR=/path/with/tinyshakespeare bench/quality_bars.sh [--only gpt|cnn]
# Logs and checkpoints go to ${OUT:-runs/quality}/<name>/.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-runs/quality}
ONLY=${2:-all}
[[ "${1:-}" == "--only" ]] || ONLY=all
if [[ ! -x "$BUILD/nanotrain" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DNT_CUDA_ARCHS=${NT_CUDA_ARCHS:-90a} >/dev/null && ninja -C "$BUILD" nanotrain
fi
mkdir -p "$OUT"
results=()

run() {   # name, bar description, train args...
  local name=$1; shift
  local bar=$1; shift
  mkdir -p "$OUT/$name"
  echo "== $name: train $*"
  local t0=$SECONDS
  "$BUILD/nanotrain" "$@" --out-dir "$OUT/$name" --no-progress > "$OUT/$name/train.log" 2>&1
  local rc=$?
  local last
  last=$(grep '^done:' "$OUT/$name/train.log" | tail -1)
  results+=("$(printf '%-22s rc=%d %4ds  %s   [bar: %s]' "$name" "$rc" $((SECONDS - t0)) "$last" "$bar")")
  tail -3 "$OUT/$name/train.log"
}

if [[ "$ONLY" == all || "$ONLY" == gpt ]]; then
  run gpt-bf16 "val loss <= 1.50" gpt --device cuda --dtype bf16 --sample 300
  run gpt-fp16 "val loss <= 1.52" gpt --device cuda --dtype fp16
fi
if [[ "$ONLY" == all || "$ONLY" == cnn ]]; then
  run cnn-fp16 "test accuracy >= 92.5%" cnn --device cuda --dtype fp16 --epochs 10
  run cnn-fp16-augment "test accuracy >= 92.5%" cnn --device cuda --dtype fp16 --epochs 10 --augment
fi
echo
echo "== quality bars"
printf '%s\n' "${results[@]}"
