#!/usr/bin/env bash
# Memory preflight: a GPT batch far beyond free memory (memest's estimate of terabytes) fails
# before training, within seconds, with a non-zero exit status and memest's figures in the
# message; on the CPU the host check says it, on a GPU the device check.
# Usage: preflight.sh NANOTRAIN cpu|cuda   (cuda: exit 77 when the build or machine has no GPU)
set -u
nt=$1
device=$2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
"$nt" gpt --device "$device" --data synthetic --vocab-size 50 --n-layer 2 --n-head 2 \
  --n-embd 64 --block-size 256 --batch-size 1048576 --max-iters 1 >"$log" 2>&1
rc=$?
cat "$log"
if [[ $device == cuda ]] && grep -q "no usable GPU" "$log"; then exit 77; fi
fail() { echo "FAIL: $*"; exit 1; }
[[ $rc -ne 0 ]] || fail "exit status 0"
[[ $rc -eq 1 ]] || fail "exit status $rc, expected 1 (out of memory)"
where=$([[ $device == cuda ]] && echo "GPU" || echo "host")
grep -Eq "needs about [0-9]+ MiB of $where memory \(memest: [0-9]+ MiB = parameters [0-9]+, gradients [0-9]+, master [0-9]+, optimizer [0-9]+, activations [0-9]+" "$log" ||
  fail "no $where-memory message with memest's figures"
grep -Eq "[0-9]+ MiB are (free|available)" "$log" || fail "the free memory is not named"
grep -q "step 1\|done:" "$log" && fail "it trained"
(( $(date +%s) - start < 30 )) || fail "took $(( $(date +%s) - start )) s"
echo "preflight ($device): refused before training with memest's figures (exit $rc)"
