#!/usr/bin/env bash
# The test command: builds (a normal build with the CUDA backend when the toolkit is found, and
# a CPU-only AddressSanitizer + UBSan build) and runs CTest in both, then (when clang is there)
# fuzzes the readers and the option parser for a fixed budget (scripts/fuzz.sh). GPU tests
# report skipped on a machine without a GPU.
# NT_DATA_DIR names the folder with tinyshakespeare.txt (tests that need it skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."
archs=${NT_CUDA_ARCHS:-90a;80}
scripts/build.sh build "-DNT_CUDA_ARCHS=$archs" -DNT_SANITIZE=OFF -DNT_FILTER=
scripts/build.sh build-asan -DNT_CUDA=OFF -DNT_SANITIZE=ON -DNT_FILTER= -DCMAKE_BUILD_TYPE=RelWithDebInfo
status=0
echo "== tests (release build) =="
(cd build && ctest --output-on-failure -j2) || status=1
echo "== CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2 -L cpu) || status=1
if command -v clang >/dev/null 2>&1; then
  echo "== libFuzzer: readers and the option parser, ${FUZZ_SECONDS:-20} s each =="
  scripts/fuzz.sh || status=1
else
  echo "== libFuzzer: skipped (no clang; scripts/install_deps.sh installs it) =="
fi
exit $status
