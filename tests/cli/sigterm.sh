#!/usr/bin/env bash
# SIGTERM during training: the loop finishes its step, saves it (the newest checkpoint) and the
# run ends with exit status 143 (128 + 15). Usage: sigterm.sh NANOTRAIN OUT_DIR
set -u
nt=$1
out=$2
rm -rf "$out"
"$nt" gpt --device cpu --data synthetic --vocab-size 50 --n-layer 1 --n-head 2 --n-embd 32 \
  --block-size 16 --batch-size 4 --eval-interval 0 --log-interval 1 --max-iters 1000000 \
  --checkpoint-interval 5 --out-dir "$out" >"$out.log" 2>&1 &
pid=$!
# wait until the loop runs (its first checkpoint is there), at most 60 s
for _ in $(seq 600); do
  [[ -f "$out/latest" ]] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
if [[ ! -f "$out/latest" ]]; then
  echo "FAIL: no checkpoint appeared"; cat "$out.log"; kill -9 $pid 2>/dev/null; exit 1
fi
kill -TERM $pid
wait $pid
rc=$?
cat "$out.log"
if [[ $rc -ne 143 ]]; then echo "FAIL: exit status $rc, expected 143"; exit 1; fi
# the loop finished its step, said so, and the checkpoint of that step is the newest one
step=$(sed -n 's/^stopping after this step (step \([0-9]*\)).*/\1/p' "$out.log")
if [[ -z "$step" ]]; then echo "FAIL: the loop did not report the stop"; exit 1; fi
grep -q "saved checkpoint .*ckpt-$step (step $step)" "$out.log" ||
  { echo "FAIL: no checkpoint of step $step saved"; exit 1; }
latest=$(head -n1 "$out/latest")
if [[ "$latest" != "ckpt-$step" ]]; then
  echo "FAIL: latest names '$latest', expected ckpt-$step"; exit 1
fi
echo "exit status 143, checkpoint of step $step saved"
