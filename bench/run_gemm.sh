#!/usr/bin/env bash
# GEMM benchmark: nanotrain's nt_gemm (bench_gemm) and torch.matmul (bench_gemm.py) on the same
# shapes in one run; prints the side-by-side table and writes it to $build/bench/gemm_table.md.
# Builds nothing. Usage: bench/run_gemm.sh [build-dir (default build)] [bf16|f16 (default bf16)]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
dtype="${2:-bf16}"
bin="$build/bench/bench_gemm"
[ -x "$bin" ] || { echo "run_gemm.sh: $bin not found (build first: cmake --build $build)" >&2; exit 1; }
raw="$build/bench/gemm_nt.txt"
table="$build/bench/gemm_table.md"
"$bin" --dtype "$dtype" | tee "$raw"
echo
python3 "$here/bench_gemm.py" "$raw" --dtype "$dtype" | tee "$table"
echo "table written to $table"
