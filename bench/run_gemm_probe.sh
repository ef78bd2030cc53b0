#!/usr/bin/env bash
# GEMM probe (bench/gemm_probe.c): cuBLASLt's heuristic candidates in four formulations of the
# same row-major product against cublasGemmEx (torch.matmul's call), all timed sustained, for
# the bf16 shapes below 0.95x torch in bench/RESULTS.md. Logs to $build/bench/gemm_probe.log
# and appends the names of the tile ids seen (cublasLtMatmulTile_t, from cublasLt.h). ~2 min.
#
#   bench/run_gemm_probe.sh [build-dir (default build)] [gemm_probe options...]
#
# e.g. bench/run_gemm_probe.sh build --shapes gpt2.lmhead.dW --warm-ms 300. Builds nothing.
set -euo pipefail
build="${1:-build}"
[ $# -gt 0 ] && shift
bin="$build/bench/gemm_probe"
[ -x "$bin" ] || { echo "run_gemm_probe.sh: $bin not found (build first: cmake --build $build --target gemm_probe)" >&2; exit 1; }
log="$build/bench/gemm_probe.log"
"$bin" "$@" 2>&1 | tee "$log"
# Tile ids -> names (the header that the probe was built against, when it is found).
hdr=""
for d in "${CUDA_HOME:-}" /usr/local/cuda; do
  [ -n "$d" ] && [ -f "$d/include/cublasLt.h" ] && { hdr="$d/include/cublasLt.h"; break; }
done
if [ -n "$hdr" ]; then
  ids="$(grep -o 'tile [0-9]*' "$log" | awk '{print $2}' | sort -un | tr "\n" " " || true)"
  {
    echo
    echo "Tile ids seen (from $hdr):"
    for id in $ids; do
      name="$(grep -oE "CUBLASLT_MATMUL_TILE_[0-9x]+ = $id," "$hdr" | head -1 | sed -E 's/CUBLASLT_MATMUL_TILE_([0-9x]+) = .*/\1/')"
      echo "  tile $id = ${name:-?}"
    done
  } | tee -a "$log"
fi
echo "log written to $log"
