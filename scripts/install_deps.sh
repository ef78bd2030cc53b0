#!/usr/bin/env bash
# Installs what the build needs on a Debian-like machine (as root, or through sudo).
# The CUDA toolkit is optional: without nvcc the CPU backend alone is built.
set -euo pipefail
# openmpi: the MPI backend of dist/ and the multi-rank CPU tests (mpirun).
pkgs="cmake ninja-build gcc g++ pkg-config libopenblas-dev zlib1g-dev dataset-fashion-mnist python3 python3-numpy openmpi-bin libopenmpi-dev"
# clang (with libFuzzer and the sanitizers' runtimes): scripts/fuzz.sh, run by scripts/test.sh
pkgs="$pkgs clang"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing:$missing"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing
fi
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "CUDA toolkit: $( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) )"
else
  echo "CUDA toolkit not found: building the CPU backend only"
fi
