#!/usr/bin/env bash
# Fuzzes the data and checkpoint readers and the option parser with libFuzzer under ASan +
# UBSan: builds build-fuzz with clang (CPU only), then runs each target for a fixed budget
# (FUZZ_SECONDS, default 20) from its seed corpus in fuzz/corpus/<target>/ (new inputs go to a
# scratch copy, the committed corpus is not modified). Exit 1 on any crash, leak or timeout;
# crash inputs are kept in build-fuzz/crashes/.
#   scripts/fuzz.sh [target...]      (targets: idx text shard safetensors json cli)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-20}
targets=${*:-idx text shard safetensors json cli}
command -v clang >/dev/null || { echo "clang not found: fuzzing skipped"; exit 77; }
CC=clang cmake -S . -B build-fuzz -G Ninja -DNT_CUDA=OFF -DNT_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNT_FILTER= >/dev/null
cmake --build build-fuzz -j2 --target $(for t in $targets; do printf 'fuzz_%s ' "$t"; done)
mkdir -p build-fuzz/crashes
status=0
for t in $targets; do
  work=build-fuzz/corpus-$t
  rm -rf "$work"
  mkdir -p "$work"
  cp fuzz/corpus/$t/* "$work"/
  echo "== fuzz_$t: ${secs} s =="
  # -close_fd_mask=1: the target's stdout (help text) is dropped; reports still come through
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       build-fuzz/fuzz/fuzz_$t -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
       -close_fd_mask=1 -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/$t- \
       "$work" 2>build-fuzz/fuzz_$t.log; then
    echo "fuzz_$t FAILED (log: build-fuzz/fuzz_$t.log)"
    grep -E "ERROR|SUMMARY|runtime error" build-fuzz/fuzz_$t.log | head -5
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" build-fuzz/fuzz_$t.log |
      tr '\n' ' '
    echo
  fi
done
exit $status
