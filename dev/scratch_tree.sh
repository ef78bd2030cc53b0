# Sourced by the experiment scripts under dev/ (from the repository root, `. dev/scratch_tree.sh
# DIR`): sets out ($OUT, made if missing), here (the repository) and NT_DATA_DIR (default
# here/.data), puts the CUDA toolkit on PATH, and moves into DIR, a fresh copy of the working
# tree without data, builds or git, so that patches applied there never touch this tree.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
out=${OUT:-/tmp/nt-out}
mkdir -p "$out"
here=$PWD
export NT_DATA_DIR=${NT_DATA_DIR:-$here/.data}
rm -rf "$1" && mkdir -p "$1"
tar --exclude=./.data --exclude='./build*' --exclude=./runs --exclude=./.git -cf - . | tar -xf - -C "$1"
cd "$1"
