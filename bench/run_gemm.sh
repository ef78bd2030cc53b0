#!/usr/bin/env bash
# GEMM benchmark: nanotrain's nt_gemm (bench_gemm) and torch.matmul (bench_gemm.py), shape by
# shape, interleaved, measured the same way (see bench_gemm.py); prints the side-by-side table
# and writes it to $build/bench/gemm_table.md. Builds nothing.
#
#   bench/run_gemm.sh [build-dir (default build)] [bf16|f16 (default bf16)] [diag|search|search2]
#
# diag (off by default; a few minutes more): after the table, logs which kernels each side
# runs. nanotrain: NT_LOG=debug (each plan's heuristic candidates with their autotune times and
# the kernel kept: algo, tile, stages, splitK, reduction, swizzle, cluster) and
# CUBLASLT_LOG_LEVEL=2 (every cublasLtMatmul with its algorithm); torch: CUBLASLT_LOG_LEVEL=2
# and CUBLAS_LOGINFO_DBG=1, with its default BLAS and once more with torch preferring cuBLASLt
# (--torch-lt, a second table). Logs in $build/bench/gemm_diag/, one short summary printed.
#
# search (instead of the plain table; ~2x its time plus the tuning): every shape with the
# autotuner's heuristic list only (NT_GEMM_SEARCH=0) and with the default widened search
# (NT_GEMM_SEARCH=1) side by side with torch, the one-time tuning cost per shape (tune s) and
# whether the search kept a configuration from outside the heuristic's top 32 (won). Table in
# $build/bench/gemm_search_table.md.
#
# search2 (diagnosis, several minutes): the four shapes below 0.95x in bench/RESULTS.md with
# modes 0, 1 and 2 (exhaustive), one round, nanotrain's NT_LOG=debug logs kept per run
# (each plan's search summary, its 12 fastest configurations and the kept one, ids spelled out),
# and the cuBLASLt calls torch makes for the same shapes (CUBLASLT_LOG_LEVEL=2). Table in
# $build/bench/gemm_search2_table.md, logs in $build/bench/gemm_search_logs/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
dtype="${2:-bf16}"
mode="${3:-}"
bin="$build/bench/bench_gemm"
[ -x "$bin" ] || { echo "run_gemm.sh: $bin not found (build first: cmake --build $build)" >&2; exit 1; }
if [ "$mode" = search ]; then
  table="$build/bench/gemm_search_table.md"
  python3 "$here/bench_gemm.py" "$bin" --dtype "$dtype" --search-modes 0,1 | tee "$table"
  echo "table written to $table"
  exit 0
fi
if [ "$mode" = search2 ]; then
  targets=small.proj.dx,gpt2.lmhead.dx,gpt2.lmhead.dW,square.8192
  logs="$build/bench/gemm_search_logs"
  rm -rf "$logs"
  mkdir -p "$logs"
  table="$build/bench/gemm_search2_table.md"
  python3 "$here/bench_gemm.py" "$bin" --dtype "$dtype" --shapes "$targets" --search-modes 0,1,2 \
    --rounds 1 --nt-log "$logs" | tee "$table"
  echo
  python3 "$here/bench_gemm.py" --summarize-logs "$logs" | tee "$logs/summary.txt"
  echo "== torch's cuBLASLt calls for the same shapes (addresses stripped, counted)"
  CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE="$logs/torch_cublaslt.%i.log" \
    python3 "$here/bench_gemm.py" "$bin" --dtype "$dtype" --shapes "$targets" --search-modes 0 \
    --repeats 3 --rounds 1 >"$logs/torch_logged_table.md" 2>&1 || true
  cat "$logs"/torch_cublaslt.*.log 2>/dev/null | grep -E "cublasLtMatmul\]" |
    sed -E 's/^\[[^]]*\]\[[^]]*\]\[[^]]*\]//; s/0[xX][0-9a-fA-F]+/P/g' | sort | uniq -c |
    sort -rn | head -40 || true
  echo "table written to $table; logs in $logs"
  exit 0
fi
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
