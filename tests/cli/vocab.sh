#!/usr/bin/env bash
# The checkpoint records the GPT's character vocabulary: a resume on another text fails with
# exit status 2 ("trained on another text"), and sampling from a checkpoint (a resume that
# trains no further) does not write the checkpoint. Usage: vocab.sh NANOTRAIN WORK_DIR
set -u
nt=$1
work=$2
rm -rf "$work"
mkdir -p "$work/a" "$work/b"
for i in $(seq 400); do echo "the cat sat on the mat $i"; done >"$work/a/tinyshakespeare.txt"
for i in $(seq 400); do echo "THE DOG RAN TO THE LOG $i!"; done >"$work/b/tinyshakespeare.txt"
args=(gpt --device cpu --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4
      --eval-interval 5 --eval-iters 2 --log-interval 5 --out-dir "$work/out")
fail() { echo "FAIL: $*"; cat "$work/log"; exit 1; }
"$nt" "${args[@]}" --data-dir "$work/a" --max-iters 10 >"$work/log" 2>&1 || fail "first run"
grep -q '"vocab":\[' "$work/out/ckpt-10/ckpt.json" || fail "no vocabulary in the sidecar"
"$nt" "${args[@]}" --data-dir "$work/b" --max-iters 20 --resume "$work/out" >"$work/log" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "resume on another text: exit status $rc, expected 2"
grep -q "trained on another text" "$work/log" || fail "no 'trained on another text' message"
before=$(sha256sum "$work/out/ckpt-10/MANIFEST.json" "$work/out/ckpt-10/ckpt.json")
"$nt" "${args[@]}" --data-dir "$work/a" --max-iters 10 --sample 40 --resume "$work/out" \
  >"$work/log" 2>&1 || fail "sampling from the checkpoint"
grep -q -- "---- sample ----" "$work/log" || fail "no sample printed"
if grep -q "saved checkpoint" "$work/log"; then fail "sampling wrote a checkpoint"; fi
after=$(sha256sum "$work/out/ckpt-10/MANIFEST.json" "$work/out/ckpt-10/ckpt.json")
[[ "$before" == "$after" ]] || fail "the checkpoint changed while sampling"
echo "vocabulary saved; another text refused (exit 2); sampling left the checkpoint unchanged"
