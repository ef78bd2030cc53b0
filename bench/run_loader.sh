#!/usr/bin/env bash
# Runs the data loader benchmark (nanotrain, bench_loader) and torch's DataLoader on the same
# batches (bench_loader.py), then prints one table. Usage: bench/run_loader.sh [build-dir]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
bin="$build/bench/bench_loader"
[ -x "$bin" ] || { echo "run_loader.sh: $bin not found (build first: cmake --build $build)" >&2; exit 1; }

out_nt="$("$bin")"
echo "$out_nt" | grep -v '^RESULT'
echo
out_pt="$(python3 "$here/bench_loader.py" 2>&1)" || { echo "$out_pt" >&2; out_pt=""; }
echo "$out_pt" | grep -v '^RESULT' || true
echo

val() { printf '%s\n%s\n' "$out_nt" "$out_pt" | awk -v k="$1" '$1 == "RESULT" && $2 == k { print $3 }'; }
printf '%-34s %14s %14s\n' "CNN loop (bs 256, 4 workers)" "nanotrain" "torch"
printf '%-34s %14s %14s\n' "compute alone, ms/step" "$(val compute_ms)" "$(val torch_compute_ms)"
printf '%-34s %14s %14s\n' "with the loader, ms/step" "$(val loop_ms)" "$(val torch_loop_ms)"
printf '%-34s %14s %14s\n' "data wait, % of step (bar < 1)" "$(val wait_pct)" "$(val torch_wait_pct)"
printf '%-34s %14s %14s\n' "images / s" "$(val images_per_s)" "$(val torch_images_per_s)"
plain="$(val h2d_plain_gbs)"; slots="$(val h2d_loader_gbs)"
printf '%-34s %14s\n' "H2D plain pinned, GB/s" "$plain"
printf '%-34s %14s %13s%%\n' "H2D from loader slots, GB/s" "$slots" \
  "$(awk -v a="$slots" -v b="$plain" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b }')"
