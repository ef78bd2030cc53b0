#!/usr/bin/env bash
# Writes a Fashion-MNIST-shaped dataset into DIR: N_TRAIN and N_TEST random 28x28 images with
# labels 0..9, as plain IDX files under the .gz names (the reader takes plain files too), for
# runs that need the CNN's data but not its contents.
# Usage: fashion_like.sh DIR [N_TRAIN [N_TEST]]   (64 and 32 by default)
set -eu
dir=$1 n_train=${2:-64} n_test=${3:-32}
mkdir -p "$dir"
be32() {   # a big-endian 32-bit integer
  for shift in 24 16 8 0; do printf "\\x$(printf %02x $(($1 >> shift & 255)))"; done
}
for split in "train:$n_train" "t10k:$n_test"; do
  name=${split%:*} n=${split#*:}
  { printf '\x00\x00\x08\x03'; be32 "$n"; be32 28; be32 28; head -c $((n * 784)) /dev/urandom; } \
    >"$dir/$name-images-idx3-ubyte.gz"
  { printf '\x00\x00\x08\x01'; be32 "$n"; for i in $(seq "$n"); do printf "\\x0$((i % 10))"; done; } \
    >"$dir/$name-labels-idx1-ubyte.gz"
done
