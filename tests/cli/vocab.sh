#!/usr/bin/env bash
# The checkpoint records the GPT's character vocabulary: a resume on another text fails with
# exit status 2 ("trained on another text"); sampling from a checkpoint (a resume that trains
# no further) writes no file and prints no NUL; a checkpoint without its vocabulary is refused.
# Usage: vocab.sh NANOTRAIN WORK_DIR
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
# sampling from the checkpoint (a resume at its step): every file of the out-dir is unchanged
# but .lock (which holds the running process's id), and the sample is text (no NUL byte)
sums() { (cd "$work/out" && find . -type f ! -name .lock | sort | xargs sha256sum); }
before=$(sums)
"$nt" "${args[@]}" --data-dir "$work/a" --max-iters 10 --sample 200 --resume "$work/out" \
  >"$work/log" 2>&1 || fail "sampling from the checkpoint"
grep -q -- "---- sample ----" "$work/log" || fail "no sample printed"
if grep -q "saved checkpoint" "$work/log"; then fail "sampling wrote a checkpoint"; fi
[[ $(tr -d '\000' <"$work/log" | wc -c) -eq $(wc -c <"$work/log") ]] || fail "a NUL in the sample"
after=$(sums)
[[ "$before" == "$after" ]] || fail "sampling changed the out-dir: $(diff <(echo "$before") <(echo "$after"))"
[[ $(echo "$before" | wc -l) -ge 5 ]] || fail "too few files checked: $before"
# a text checkpoint without its vocabulary (the sidecar edited, the manifest made to match) is
# refused, not sampled with the corpus's
ck=$work/out/ckpt-10
sed -i 's/"vocab":\[[0-9,]*\],//' "$ck/ckpt.json"
grep -q '"vocab"' "$ck/ckpt.json" && fail "the test could not remove the vocabulary"
size=$(wc -c <"$ck/ckpt.json")
hash=$(sha256sum "$ck/ckpt.json" | cut -d' ' -f1)
sed -i -E "s/(\"name\":\"ckpt.json\",\"size\":)[0-9]+,\"sha256\":\"[0-9a-f]+\"/\1$size,\"sha256\":\"$hash\"/" \
  "$ck/MANIFEST.json"
"$nt" "${args[@]}" --data-dir "$work/a" --max-iters 10 --sample 40 --resume "$ck" \
  >"$work/log" 2>&1
rc=$?
[[ $rc -ne 0 ]] || fail "a checkpoint without a vocabulary was sampled"
grep -q "has no vocabulary" "$work/log" || fail "no 'has no vocabulary' message (exit $rc)"
echo "vocabulary saved; another text refused (exit 2); sampling left every file unchanged;" \
     "a checkpoint without a vocabulary refused (exit $rc)"
