#!/usr/bin/env bash
# The training benchmark in one command for a GPU session: builds $BUILD/nanotrain if it is
# missing, then runs bench/bench_train.py over all three workloads (nanotrain against PyTorch's
# eager, torch.compile, padded-vocabulary, whole-step CUDA graph and DataLoader variants, timed
# the same way on both sides: see the script's docstring; GPT-2 also in FP8, --nt-fp8) and
# prints the markdown table.
# About 5 minutes on an H200 with the build present (most of it torch.compile's compilations;
# less on a warm inductor cache); a cold build adds its own minutes. Bounded: torch variants
# that would start past $BUDGET_S seconds (390) are skipped and reported as skipped.
#   OUT=/path bench/run_train.sh [bench_train.py options, e.g. --only gpt2 --windows 9]
#   (GPT-2 beside llm.c: --llmc BIN, BIN built by bench/build_llmc.sh; repeatable)
# Writes under $OUT (when set): bench_train.md (the table), bench_train.json (every window),
# bench_train.log (the whole output), bench_train_logs/<workload>/ (nanotrain's stdout and
# metrics.jsonl); $JSON, when set, names the JSON file instead (default without $OUT:
# /tmp/bench_train.json).
# Data: $NT_DATA_DIR (tinyshakespeare.txt; else .data/ when it holds it, else synthetic tokens
# on both sides) and $NT_FASHION_DIR (else .data/fashion-mnist, else the system copy).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if [[ ! -x "$BUILD/nanotrain" ]]; then
  echo "building $BUILD/nanotrain" >&2
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S . -B "$BUILD" -G Ninja -DNT_CUDA_ARCHS="${NT_CUDA_ARCHS:-90a}" >/dev/null
  ninja -C "$BUILD" nanotrain >/dev/null
fi
if [[ -z "${NT_DATA_DIR:-}" && -f .data/tinyshakespeare.txt ]]; then
  export NT_DATA_DIR="$PWD/.data"
fi
if [[ -z "${NT_FASHION_DIR:-}" && -d .data/fashion-mnist ]]; then
  export NT_FASHION_DIR="$PWD/.data/fashion-mnist"
fi
args=(--train "$BUILD/nanotrain" --budget-s "${BUDGET_S:-390}" --nt-fp8)
log=/dev/null
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  args+=(--json "${JSON:-$OUT/bench_train.json}" --log-dir "$OUT/bench_train_logs")
  log="$OUT/bench_train.log"
else
  args+=(--json "${JSON:-/tmp/bench_train.json}")
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 || true; } |
  tee "$log"
python3 -u bench/bench_train.py "${args[@]}" "$@" 2>&1 | tee -a "$log"
if [[ -n "${OUT:-}" ]]; then
  sed -n '/^| workload /,$p' "$log" > "$OUT/bench_train.md"
fi
