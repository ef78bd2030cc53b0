#!/usr/bin/env bash
# Everything a GPU session runs, in one call (device time is scarce): build for sm_90, the GPU
# tests, then the benchmarks named as arguments (bench/run_<name>.sh), logs under $OUT.
#   scripts/gpu_batch.sh [bench names...]      e.g. scripts/gpu_batch.sh gemm memops
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/nt-out}
mkdir -p "$out"
export NT_DATA_DIR="$PWD/.data" NT_FASHION_DIR="$PWD/.data/fashion-mnist"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -1
} > "$out/env.txt" 2>&1
scripts/build.sh build -DNT_CUDA_ARCHS=90 -DNT_FILTER= > "$out/build.log" 2>&1 ||
  { tail -50 "$out/build.log"; exit 1; }
./build/doctor >> "$out/env.txt" 2>&1
(cd build && ctest -L gpu --output-on-failure --timeout 300) > "$out/ctest_gpu.log" 2>&1
grep -E "tests passed|tests failed|\*\*\*|Failed|Skipped|Passed" "$out/ctest_gpu.log" | tail -40
for b in "$@"; do
  echo "== bench $b =="
  timeout 300 bash "bench/run_$b.sh" build >> "$out/bench.log" 2>&1 || echo "bench $b failed ($?)"
done
[ $# -gt 0 ] && tail -80 "$out/bench.log"
exit 0
