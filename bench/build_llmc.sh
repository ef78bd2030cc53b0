#!/usr/bin/env bash
# Builds llm.c's GPT-2 trainer (train_gpt2.cu, github.com/karpathy/llm.c) from a checkout you
# supply, for bench_train.py's llm.c row (--llmc). Nothing of llm.c is kept in this repository.
#   bench/build_llmc.sh LLMC_DIR OUT_BIN [CUDNN_FRONTEND_DIR]
# With CUDNN_FRONTEND_DIR (a checkout of github.com/NVIDIA/cudnn-frontend; header-only) the build
# uses cuDNN's fused attention, llm.c's fast path (USE_CUDNN=1 in its Makefile); without it,
# llm.c's own attention kernels. The cuDNN library and headers come from the CUDA toolkit's
# directories ($CUDNN_INCLUDE / $CUDNN_LIB override). bf16, sm_90 ($NT_CUDA_ARCHS overrides).
# llm.c's sources are copied to a temporary directory and two lines are changed there, for
# CUDA 13 and for a link without NVML:
# - its managed-memory fallback (taken only when cudaMalloc runs out of memory) calls
#   cudaMemAdvise with a device number, which CUDA 13's signature (a cudaMemLocation) rejects:
#   the hint is dropped;
# - llmc/mfu.h uses NVML when <nvml.h> exists, for its optional GPU-utilisation log (-lg):
#   turned off, so the binary needs no libnvidia-ml at link time.
# The flags are those of llm.c's Makefile for a bf16 build (-O3 --use_fast_math, C++17).
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n 2,16p "$0"; exit 2; }
src=$1 out=$2 fe=${3:-}
[[ -f $src/train_gpt2.cu && -f $src/llmc/cuda_utils.cuh ]] ||
  { echo "build_llmc: $src is not an llm.c checkout (no train_gpt2.cu)" >&2; exit 1; }
export PATH="$PATH:/usr/local/cuda/bin"
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
tmp=$(mktemp -d /tmp/llmc_build.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/train_gpt2.cu" "$src/llmc" "$tmp/"
sed -i '/cudaMemAdviseSetPreferredLocation/d' "$tmp/llmc/cuda_utils.cuh"
sed -i 's/^#if __has_include(<nvml.h>)/#if 0/' "$tmp/llmc/mfu.h"
arch=${NT_CUDA_ARCHS:-90}
flags=(--threads=0 --use_fast_math -std=c++17 -O3 -DENABLE_BF16
       "--generate-code=arch=compute_$arch,code=[compute_$arch,sm_$arch]")
libs=(-lcublas -lcublasLt)
objs=()
if [[ -n $fe ]]; then
  [[ -f $fe/include/cudnn_frontend.h ]] ||
    { echo "build_llmc: $fe has no include/cudnn_frontend.h" >&2; exit 1; }
  flags+=(-DENABLE_CUDNN -I"$fe/include" -I"${CUDNN_INCLUDE:-$cuda/include}")
  echo "build_llmc: compiling llmc/cudnn_att.cpp (a few minutes)" >&2
  nvcc "${flags[@]}" -c "$tmp/llmc/cudnn_att.cpp" -o "$tmp/cudnn_att.o"
  objs=("$tmp/cudnn_att.o")
  libs+=(-L"${CUDNN_LIB:-$cuda/lib}" -L"$cuda/lib64/stubs" -lcudnn -lnvrtc -lcuda)
fi
nvcc "${flags[@]}" "$tmp/train_gpt2.cu" "${objs[@]}" "${libs[@]}" -o "$out"
echo "build_llmc: wrote $out ($([[ -n $fe ]] && echo "cuDNN attention" || echo "llm.c's attention"))" >&2
