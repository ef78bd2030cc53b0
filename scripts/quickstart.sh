#!/usr/bin/env bash
# One command for a fresh machine: install what is missing, build, check the environment,
# and run the main job (train the CNN on Fashion-MNIST and the GPT on tiny shakespeare, or on
# the fallback corpus scripts/get_data.sh builds when tiny shakespeare cannot be had, which the
# job then names; on the GPU when there is one, with smaller settings on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh build
./build/doctor
NT_DATA_DIR="$(scripts/get_data.sh)"
export NT_DATA_DIR
if [[ "$NT_DATA_DIR" == */fallback ]]; then
  echo "NOTE: tiny shakespeare is not available; the GPT trains on a fallback corpus (the" \
       "system's license texts) and its losses are not comparable to tiny shakespeare's"
fi
exec scripts/main_job.sh
