#!/usr/bin/env bash
# GEMM benchmark: nanotrain's nt_gemm (bench_gemm) and torch.matmul (bench_gemm.py), shape by
# shape, interleaved, measured the same way (see bench_gemm.py); prints the side-by-side table
# and writes it to $build/bench/gemm_table.md. Builds nothing.
#
#   bench/run_gemm.sh [build-dir (default build)] [bf16|f16 (default bf16)] [diag]
#
# diag (off by default; a few minutes more): after the table, logs which kernels each side
# runs. nanotrain: NT_LOG=debug (each plan's heuristic candidates with their autotune times and
# the kernel kept: algo, tile, stages, splitK, reduction, swizzle, cluster) and
# CUBLASLT_LOG_LEVEL=2 (every cublasLtMatmul with its algorithm); torch: CUBLASLT_LOG_LEVEL=2
# and CUBLAS_LOGINFO_DBG=1, with its default BLAS and once more with torch preferring cuBLASLt
# (--torch-lt, a second table). Logs in $build/bench/gemm_diag/, one short summary printed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
dtype="${2:-bf16}"
mode="${3:-}"
bin="$build/bench/bench_gemm"
[ -x "$bin" ] || { echo "run_gemm.sh: $bin not found (build first: cmake --build $build)" >&2; exit 1; }
table="$build/bench/gemm_table.md"
python3 "$here/bench_gemm.py" "$bin" --dtype "$dtype" | tee "$table"
echo "table written to $table"
[ "$mode" = diag ] || exit 0

diag="$build/bench/gemm_diag"
mkdir -p "$diag"
# nanotrain alone, all shapes in one process, few repeats (the logs grow with every call).
NT_LOG=debug CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE="$diag/nt_cublaslt.%i.log" \
  "$bin" --dtype "$dtype" --repeats 3 >"$diag/nt_results.txt" 2>"$diag/nt_plans.log" || true
# torch with its default BLAS, then preferring cuBLASLt; the nanotrain side runs again (its own
# logs are not kept here) so each table is complete.
CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE="$diag/torch_cublaslt.%i.log" CUBLAS_LOGINFO_DBG=1 \
  CUBLAS_LOGDEST_DBG="$diag/torch_cublas.log" \
  python3 "$here/bench_gemm.py" "$bin" --dtype "$dtype" --repeats 3 --rounds 1 \
  >"$diag/torch_default_table.md" 2>&1 || true
python3 "$here/bench_gemm.py" "$bin" --dtype "$dtype" --torch-lt | tee "$diag/torch_lt_table.md"
echo
echo "== nanotrain plans (kernel kept per shape; candidates' ms in nt_plans.log)"
grep -E "gemm plan" "$diag/nt_plans.log" | sed -E 's/ \[cuBLASLt.*//' | head -40 || true
echo "== cublasLtMatmul algorithm lines, nanotrain then torch (addresses stripped, counted)"
for side in nt torch; do
  echo "-- $side"
  cat "$diag/${side}"_cublaslt.*.log 2>/dev/null | grep -E "cublasLtMatmul\]" |
    sed -E 's/^\[[^]]*\]\[[^]]*\]\[[^]]*\]//; s/0[xX][0-9a-fA-F]+/P/g' | sort | uniq -c |
    sort -rn | head -40 || true
done
echo "logs in $diag"
