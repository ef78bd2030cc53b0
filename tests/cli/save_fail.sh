#!/usr/bin/env bash
# A checkpoint that cannot be written costs a warning, not the run: mid-run the out-dir is moved
# away and a plain file put in its place (so saves and metrics writes fail, even as root), then
# the directory comes back; the run warns, trains on, saves again at a later save point and,
# stopped by SIGTERM, exits 143. Usage: save_fail.sh NANOTRAIN OUT_DIR
set -u
nt=$1
out=$2
rm -rf "$out" "$out.away" "$out.log"   # a previous run's log would satisfy wait_for at once
"$nt" gpt --device cpu --data synthetic --vocab-size 50 --n-layer 1 --n-head 2 --n-embd 32 \
  --block-size 16 --batch-size 4 --eval-interval 0 --log-interval 1 --max-iters 1000000 \
  --checkpoint-interval 5 --out-dir "$out" >"$out.log" 2>&1 &
pid=$!
fail() { echo "FAIL: $*"; cat "$out.log"; kill -9 $pid 2>/dev/null; exit 1; }
wait_for() {   # wait_for PATTERN: until the log has it, at most 60 s
  for _ in $(seq 600); do
    grep -qs "$1" "$out.log" && return 0
    kill -0 $pid 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
wait_for "saved checkpoint" || fail "no first checkpoint"
mv "$out" "$out.away" || fail "cannot move the out-dir"
# a save may make the out-dir again between the move and the file taking its place: retry
for _ in $(seq 100); do
  [[ -f "$out" ]] && break
  rm -rf "$out"
  touch "$out" 2>/dev/null
done
[[ -f "$out" ]] || fail "cannot put a file in the out-dir's place"
wait_for "warning: checkpoint at step [0-9]* not saved" || fail "no warning for the failed save"
rm -f "$out" && mv "$out.away" "$out"
n=$(grep -c "saved checkpoint" "$out.log")
for _ in $(seq 600); do
  [[ $(grep -c "saved checkpoint" "$out.log") -gt $n ]] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
[[ $(grep -c "saved checkpoint" "$out.log") -gt $n ]] || fail "no save after the out-dir came back"
kill -TERM $pid
wait $pid
rc=$?
[[ $rc -eq 143 ]] || fail "exit status $rc, expected 143"
grep -q "warning: metrics not written" "$out.log" || fail "no warning for the failed metrics write"
failed=$(sed -n 's/.*warning: checkpoint at step \([0-9]*\) not saved.*/\1/p' "$out.log" | head -n1)
later=$(sed -n 's/^saved checkpoint .*(step \([0-9]*\))$/\1/p' "$out.log" | tail -n1)
[[ $later -gt $failed ]] || fail "the last save (step $later) is not after the failed one ($failed)"
echo "save at step $failed failed with a warning; training went on and saved step $later"
