#!/usr/bin/env bash
# The CNN's conv / maxpool ops and its forward+backward: nanotrain (bench_cnn_ops) next to torch
# with cuDNN (bench_cnn_ops.py, the faster of nchw / channels_last) at the same shapes and
# dtypes, in one table; x = torch_ms / nanotrain_ms (>= 1.00: nanotrain at least as fast).
# "graph": ops replayed from a CUDA graph (no launch overhead); "eager": launched one by one.
# Usage: bench/run_cnn_ops.sh [build-dir (default build)] [dtype: f16|bf16|f32|all (default all)]
#        [batch (default 256)]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
dt="${2:-all}"
nb="${3:-256}"
bin="$build/bench/bench_cnn_ops"
if [ ! -x "$bin" ]; then
  echo "run_cnn_ops.sh: $bin not found (build first: cmake --build $build)" >&2
  exit 1
fi
out_nt="$("$bin" --dtype "$dt" --batch "$nb" 2>&1)" ||
  { echo "$out_nt" >&2; echo "run_cnn_ops.sh: $bin failed" >&2; }
out_pt="$(python3 "$here/bench_cnn_ops.py" --dtype "$dt" --batch "$nb" 2>&1)" ||
  { echo "$out_pt" >&2; echo "run_cnn_ops.sh: bench_cnn_ops.py failed" >&2; }
echo "$out_pt" | grep -v '^RESULT' || true
echo
printf '%s\n%s\n' "$out_nt" "$out_pt" | awk -v nb="$nb" '
  $1 == "RESULT" { k = $3 SUBSEP $4; v[$2, k, $5] = $6; if ($2 == "torch") fmt[k, $5] = $7
                   if (!(k in seen)) { seen[k] = 1; order[n++] = k } }
  function cell(k, m,   a, b) {
    a = v["nt", k, m]; b = v["torch", k, m]
    return sprintf("%8s %8s %-4s %5s", a == "" ? "-" : a, b == "" ? "-" : b,
                   fmt[k, m] == "channels_last" ? "(cl)" : "",
                   (a > 0 && b > 0) ? sprintf("%.2f", b / a) : "-")
  }
  END {
    printf "%-5s %-22s | %-28s | %-28s\n", "dtype", "op (batch " nb ")", "graph ms: nt torch x",
           "eager ms: nt torch x"
    for (i = 0; i < n; i++) {
      split(order[i], p, SUBSEP)
      printf "%-5s %-22s | %s | %s\n", p[1], p[2], cell(order[i], "graph"), cell(order[i], "eager")
    }
    for (i = 0; i < n; i++) {
      split(order[i], p, SUBSEP)
      if (p[2] != "model_fwd_bwd") continue
      for (j = 0; j < 2; j++) {
        m = j ? "eager" : "graph"; a = v["nt", order[i], m]; b = v["torch", order[i], m]
        printf "%s %s %s: nt %s ms (%s images/s), torch %s ms (%s images/s)\n", p[1], p[2], m,
               (a == "" ? "-" : a), ((a > 0) ? sprintf("%.0f", nb / a * 1000) : "-"),
               (b == "" ? "-" : b), ((b > 0) ? sprintf("%.0f", nb / b * 1000) : "-")
      }
    }
    print "(cl): torch was faster in channels_last. model_fwd_bwd: nt without the loss (a fixed"
    print "dlogits), torch with cross-entropy under autocast; neither has the optimizer or data."
  }'
