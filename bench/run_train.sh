#!/usr/bin/env bash
# Training benchmark on the GPU machine: builds build/nanotrain if needed, then runs
# bench/bench_train.py (nanotrain vs PyTorch eager / torch.compile / DataLoader on the same GPU)
# and prints its table. Extra arguments go to bench_train.py (e.g. --only gpt2 --steps 100).
#   NT_DATA_DIR=/path/with/tinyshakespeare bench/run_train.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if [[ ! -x "$BUILD/nanotrain" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DNT_CUDA_ARCHS=${NT_CUDA_ARCHS:-90a} >/dev/null
  ninja -C "$BUILD" nanotrain
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 bench/bench_train.py --train "$BUILD/nanotrain" --json "${JSON:-/tmp/bench_train.json}" "$@"
