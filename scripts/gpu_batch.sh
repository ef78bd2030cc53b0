#!/usr/bin/env bash
# What a GPU session runs, in as few calls as possible (device time is scarce). Logs under $OUT.
#   scripts/gpu_batch.sh tests      build for sm_90, doctor, every `gpu` test, the quality bars
#   scripts/gpu_batch.sh bench      the side-by-side benchmarks (the build must exist)
# Data: .data/tinyshakespeare.txt and .data/fashion-mnist/*.gz (copied there, git-ignored).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/nt-out}
mkdir -p "$out"
export NT_DATA_DIR="$PWD/.data" NT_FASHION_DIR="$PWD/.data/fashion-mnist"
case "${1:-tests}" in
tests)
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    nvcc --version | tail -1; } > "$out/env.txt" 2>&1
  scripts/build.sh build -DNT_CUDA_ARCHS=90a -DNT_FILTER= > "$out/build.log" 2>&1 ||
    { grep -A5 error "$out/build.log" | head -40; exit 1; }
  ./build/doctor >> "$out/env.txt" 2>&1
  (cd build && ctest -L gpu --output-on-failure --timeout 300) > "$out/ctest_gpu.log" 2>&1
  grep -E "tests passed|\*\*\*|Failed" "$out/ctest_gpu.log" | tail -20
  # The quality bars: the two GPT runs share the GPU, then the CNN.
  OUT=runs/q BUILD=build bash bench/quality_bars.sh --only gpt > "$out/quality_gpt.log" 2>&1 &
  OUT=runs/q BUILD=build bash bench/quality_bars.sh --only cnn > "$out/quality_cnn.log" 2>&1
  wait
  tail -n 4 "$out/quality_gpt.log" "$out/quality_cnn.log"
  cp runs/q/gpt-bf16/train.log "$out/gpt_bf16_train.log" 2>/dev/null
  ;;
bench)
  run() {  # name, command...
    local name=$1; shift
    echo "== bench $name" > "$out/bench_$name.log"
    timeout 420 "$@" >> "$out/bench_$name.log" 2>&1 || echo "bench $name failed ($?)"
  }
  run gemm bash bench/run_gemm.sh build
  run attention bash bench/run_attention.sh build 30 noprof
  run cnn_ops bash bench/run_cnn_ops.sh build f16
  run train env BUILD=build JSON="$out/bench_train.json" bash bench/run_train.sh
  tail -n 25 "$out"/bench_*.log
  ;;
esac
exit 0
