#!/usr/bin/env bash
# Fused AdamW benchmark: nanotrain's nt_adamw_step (bench_adamw) and torch.optim.AdamW(fused=True)
# (bench_adamw.py) on GPT-2 124M's parameters in one run; prints the side-by-side table and
# writes it to $build/bench/adamw_table.md. Builds nothing.
# Usage: bench/run_adamw.sh [build-dir (default build)]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
bin="$build/bench/bench_adamw"
[ -x "$bin" ] || { echo "run_adamw.sh: $bin not found (build first: cmake --build $build)" >&2; exit 1; }
raw="$build/bench/adamw_nt.txt"
table="$build/bench/adamw_table.md"
"$bin" | tee "$raw"
echo
python3 "$here/bench_adamw.py" "$raw" | tee "$table"
echo "table written to $table"
