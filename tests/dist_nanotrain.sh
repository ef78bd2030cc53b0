#!/usr/bin/env bash
# Multi-rank runs of the nanotrain program against one process (tests/dist_nanotrain.cmake
# lists the cases). Usage: dist_nanotrain.sh MODE NANOTRAIN MPIEXEC WORKDIR ARGS...
#   ref     MODEL N                 one process, batch N x 4 (the reference of N ranks)
#   compare MODEL N STRATEGY [K]    N ranks, batch 4 each (K micro-steps per step: gradient
#                                   accumulation), against `ref MODEL N*K`: every training
#                                   loss and every tensor of the final checkpoint
#   resume  STAGE N STRATEGY STEPS [last]   GPT, global batch 12: resumes stage STAGE-1's
#                                   checkpoint (none for stage 1) with N ranks up to STEPS and
#                                   compares the stage's losses (the last stage also the
#                                   weights) with `ref gpt 3` (one process, batch 12)
#   sharded_save                    GPT, 4 ranks (FULL_SHARD), global batch 12, 5 steps, three
#                                   times: --checkpoint-format sharded, consolidated and both;
#                                   and the same 4 ranks kept to step 20
#   sharded_resume N STRATEGY       resumes the sharded save with N ranks up to step 20, saves
#                                   sharded, and compares losses and weights (the shards
#                                   consolidated) with the 4 ranks kept and with `ref gpt 3`
#   sharded_same                    the consolidated and the sharded save resumed by 2 ranks:
#                                   bit-identical losses and weights; the `both` checkpoint's
#                                   shards consolidate to its ckpt.safetensors exactly
#   sharded_bad                     a shard file changed (same size), missing, or holding a
#                                   tensor as F16 or one element too long (its hash
#                                   updated): refused
#   cnn_resume                      the CNN stopped mid-epoch by 2 ranks (FULL_SHARD), resumed
#                                   by one process: the rest of the epoch as `ref cnn 2`
#   stop    N [LOG]                 SIGTERM to rank 1 only: every rank stops after the same
#                                   step, the sharded checkpoint of that step holds every rank's
#                                   file, and every rank exits 143 (LOG: --log-interval, 0 by
#                                   default: the ranks agree in the gather every 10 steps;
#                                   else in the logged steps' loss gather)
#   graph   STRATEGY BACKEND        GPU, world 1 (no mpirun), the FSDP runtime over BACKEND
#                                   (nccl or local): 20 steps eager and with --cuda-graph; the
#                                   graph run must use the graph and match the eager one (losses
#                                   and weights, rtol 1e-6); exit 77 without a GPU
#   killed  N                       kills rank 1 mid-run: mpirun must end non-zero in time
#   mismatch                        two ranks with different --lr: a clear error
# Exit 77 (skipped) without mpirun, numpy or the data.
set -u
mode=$1 nt=$2 mpiexec=$3 work=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
compare="python3 $here/dist_compare_runs.py"
[ -x "$mpiexec" ] || command -v "$mpiexec" >/dev/null || { echo "no mpirun: skipped"; exit 77; }
python3 -c "import numpy" 2>/dev/null || { echo "numpy missing: skipped"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpi() { local n=$1; shift; "$mpiexec" -np "$n" --oversubscribe --bind-to none "$@"; }
mkdir -p "$work"

# fp32, no dropout; AdamW's eps 1e-6 keeps entries whose gradient is rounding noise (the
# attention's key bias) from being amplified to full-size updates that no tolerance survives
common=(--device cpu --dtype fp32 --dropout 0 --eps 1e-6 --log-interval 1 --no-progress
        --num-workers 0 --quiet)
gpt=(gpt "${common[@]}" --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --eval-interval 0)
if [ -f "${NT_DATA_DIR:-/nonexistent}/tinyshakespeare.txt" ]; then
  gpt+=(--data shakespeare)
else
  gpt+=(--data synthetic --vocab-size 64)
fi
# the CNN: 20 steps of one epoch, the subset a multiple of the global batch
cnn_args() { echo cnn "${common[@]}" --widths 4,8,16 --epochs 1 --test-subset 64 \
                  --train-subset $((80 * $1)); }

case $mode in
ref)
  model=$1 n=$2
  if [ "$model" = gpt ]; then args=("${gpt[@]}" --max-iters 20); else read -ra args <<<"$(cnn_args "$n")"; fi
  rm -rf "$work/ref_${model}_$n"
  exec "$nt" "${args[@]}" --batch-size $((4 * n)) --out-dir "$work/ref_${model}_$n"
  ;;
compare)
  model=$1 n=$2 strategy=$3 k=${4:-1}
  if [ "$model" = gpt ]; then args=("${gpt[@]}" --max-iters 20); else read -ra args <<<"$(cnn_args $((n * k)))"; fi
  out="$work/${model}_${strategy}_${n}x$k"
  rm -rf "$out"
  mpi "$n" "$nt" "${args[@]}" --batch-size 4 --sharding-strategy "$strategy" \
      --grad-accum-steps "$k" --out-dir "$out" || exit 1
  exec $compare "$out" "$work/ref_${model}_$((n * k))"
  ;;
resume)
  stage=$1 n=$2 strategy=$3 steps=$4 last=${5:-}
  out="$work/resume_$stage"
  rm -rf "$out"
  from=()
  if [ "$stage" -gt 1 ]; then from=(--resume "$work/resume_$((stage - 1))"); fi
  mpi "$n" "$nt" "${gpt[@]}" --max-iters "$steps" --batch-size $((12 / n)) \
      --sharding-strategy "$strategy" --checkpoint-format consolidated --out-dir "$out" \
      "${from[@]}" || exit 1
  first=$(( steps - 4 ))
  if [ "$last" = last ]; then
    exec $compare "$out" "$work/ref_gpt_3" --first-step "$first"
  fi
  exec $compare "$out" "$work/ref_gpt_3" --first-step "$first" --losses-only
  ;;
sharded_save)
  for fmt in sharded consolidated both; do
    rm -rf "$work/save_$fmt"
    mpi 4 "$nt" "${gpt[@]}" --max-iters 5 --batch-size 3 --sharding-strategy FULL_SHARD \
        --checkpoint-format "$fmt" --out-dir "$work/save_$fmt" || exit 1
  done
  # the run that keeps its 4 ranks to step 20 (what a resumed run must match)
  rm -rf "$work/save_kept"
  mpi 4 "$nt" "${gpt[@]}" --max-iters 20 --batch-size 3 --sharding-strategy FULL_SHARD \
      --out-dir "$work/save_kept" || exit 1
  ls "$work"/save_*/ckpt-5
  ls "$work/save_sharded/ckpt-5" | grep -q 'shard-00003-of-00004' || { echo "FAIL: no shards"; exit 1; }
  [ ! -e "$work/save_sharded/ckpt-5/ckpt.safetensors" ] || { echo "FAIL: consolidated file"; exit 1; }
  [ -e "$work/save_both/ckpt-5/ckpt.safetensors" ] || { echo "FAIL: both: no consolidated file"; exit 1; }
  echo OK
  ;;
sharded_resume)
  n=$1 strategy=$2
  out="$work/sharded_resume_${n}_$strategy"   # one folder per test: they may run at once
  rm -rf "$out"
  mpi "$n" "$nt" "${gpt[@]}" --max-iters 20 --batch-size $((12 / n)) \
      --sharding-strategy "$strategy" --checkpoint-format sharded \
      --resume "$work/save_sharded" --out-dir "$out" || exit 1
  $compare "$out" "$work/save_kept" --first-step 6 || exit 1
  exec $compare "$out" "$work/ref_gpt_3" --first-step 6
  ;;
sharded_same)
  for fmt in sharded consolidated; do
    rm -rf "$work/same_$fmt"
    mpi 2 "$nt" "${gpt[@]}" --max-iters 10 --batch-size 6 --sharding-strategy SHARD_GRAD_OP \
        --checkpoint-format consolidated --resume "$work/save_$fmt" \
        --out-dir "$work/same_$fmt" || exit 1
  done
  $compare "$work/same_sharded" "$work/same_consolidated" --first-step 6 --rtol 0 || exit 1
  exec python3 - "$here" "$work/save_both/ckpt-5" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from dist_compare_runs import consolidate, read_safetensors
d = sys.argv[2]
whole = read_safetensors(d + "/ckpt.safetensors")
parts = consolidate(d, json.load(open(d + "/MANIFEST.json"))["sharded"])
if sorted(whole) != sorted(parts):
    sys.exit(f"FAIL: names differ: {sorted(set(whole) ^ set(parts))}")
bad = [n for n in whole if not np.array_equal(whole[n], parts[n])]
if bad:
    sys.exit(f"FAIL: the shards and ckpt.safetensors differ in {bad}")
print(f"both: {len(whole)} tensors, the shards consolidate to ckpt.safetensors exactly\nOK")
PY
  ;;
sharded_bad)
  for case in changed missing f16 longer; do
    bad="$work/bad_$case"
    rm -rf "$bad"
    cp -r "$work/save_sharded" "$bad"
    rm -f "$bad/.lock"
    file=shard-00002-of-00004.safetensors
    f="$bad/ckpt-5/$file"
    if [ $case = changed ]; then
      printf '\x01' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 5 )) conv=notrunc 2>/dev/null
      want="the SHA-256 of $file does not match"
    elif [ $case = missing ]; then
      rm "$f"
      want="is incomplete: $file is missing"
    else   # a tensor of another dtype or length, with the manifest's size and hash updated
      t=$(python3 "$here/dist_bad_shard.py" "$bad/ckpt-5" $file $case) || exit 1
      want="$t in $file is F$([ $case = f16 ] && echo 16 || echo 32) with"
    fi
    log="$work/bad_$case.log"
    mpi 2 "$nt" "${gpt[@]}" --max-iters 10 --batch-size 6 --sharding-strategy FULL_SHARD \
        --resume "$bad" --dist-timeout 20 >"$log" 2>&1
    rc=$?
    cat "$log"
    [ "$rc" -ne 0 ] || { echo "FAIL: $case shard accepted"; exit 1; }
    grep -q "$want" "$log" || { echo "FAIL: $case: no message '$want'"; exit 1; }
  done
  echo OK
  ;;
cnn_resume)
  read -ra args <<<"$(cnn_args 2)"
  rm -rf "$work/cnn_resume_a" "$work/cnn_resume_b"
  mpi 2 "$nt" "${args[@]}" --batch-size 4 --max-iters 10 --sharding-strategy FULL_SHARD \
      --out-dir "$work/cnn_resume_a" || exit 1
  "$nt" "${args[@]}" --batch-size 8 --max-iters 0 --resume "$work/cnn_resume_a" \
      --out-dir "$work/cnn_resume_b" || exit 1
  exec $compare "$work/cnn_resume_b" "$work/ref_cnn_2" --first-step 11
  ;;
stop)
  n=$1 log=${2:-0}
  out="$work/stop"
  rm -rf "$out" "$work"/stop_rc.* "$work"/stop_pid.*
  # each rank records its pid and exit status (the signal goes to the program itself)
  W="$work" "$mpiexec" -np "$n" --oversubscribe --bind-to none bash -c \
      '"$@" & p=$!; echo $p >"$W/stop_pid.$OMPI_COMM_WORLD_RANK"; wait $p
       echo $? >"$W/stop_rc.$OMPI_COMM_WORLD_RANK"' _ \
      "$nt" "${gpt[@]}" --max-iters 1000000 --batch-size 4 --log-interval "$log" \
      --checkpoint-interval 20 --sharding-strategy FULL_SHARD --dist-timeout 30 \
      --out-dir "$out" >"$work/stop.log" 2>&1 &
  job=$!
  # the signal once training runs (a first checkpoint exists): before the loop polls, a signal
  # ends a process at once, by design
  for _ in $(seq 1 600); do [ -s "$out/latest" ] && [ -s "$work/stop_pid.1" ] && break; sleep 0.1; done
  [ -s "$out/latest" ] || { kill "$job"; echo "FAIL: the ranks did not start training"; exit 1; }
  kill -TERM "$(cat "$work/stop_pid.1")"
  for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then kill "$job"; echo "FAIL: still running 30 s after the signal"; exit 1; fi
  wait "$job"
  cat "$work/stop.log"
  for r in $(seq 0 $((n - 1))); do
    rc=$(cat "$work/stop_rc.$r" 2>/dev/null)
    echo "rank $r exited ${rc:-?}"
    [ "$rc" = 143 ] || { echo "FAIL: rank $r did not exit 143"; exit 1; }
  done
  step=$(sed -n 's/.*stopping after this step (step \([0-9]*\)).*/\1/p' "$work/stop.log")
  ckpt="$out/$(cat "$out/latest")"
  echo "stopped at step $step; $ckpt: $(ls "$ckpt" | tr '\n' ' ')"
  [ -n "$step" ] && [ "$ckpt" = "$out/ckpt-$step" ] || { echo "FAIL: no checkpoint of step $step"; exit 1; }
  [ "$(ls "$ckpt" | grep -c "^shard-.*-of-0000$n.safetensors")" = "$n" ] \
      || { echo "FAIL: not every rank's shard"; exit 1; }
  echo OK
  ;;
graph)
  strategy=$1 backend=$2
  out="$work/graph_${strategy}_$backend"
  rm -rf "$out"
  args=(gpt --device cuda --dtype fp32 --dropout 0 --eps 1e-6 --log-interval 1 --no-progress
        --num-workers 0 --n-layer 2 --n-head 2 --n-embd 64 --block-size 64 --eval-interval 0
        --data synthetic --vocab-size 64 --max-iters 20 --batch-size 8
        --sharding-strategy "$strategy" --dist-backend "$backend")
  # Two processes: each would autotune its GEMMs, and a timed pick can differ between them
  # (another algorithm, other rounding: the H200 showed 5e-9 in c_attn.bias, whose key part
  # has a zero gradient and holds only rounding noise). cuBLASLt's first heuristic pick on both.
  export NT_GEMM_AUTOTUNE=0
  "$nt" "${args[@]}" --no-cuda-graph --out-dir "$out/eager" >"$out.eager.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q "no usable GPU" "$out.eager.log"; then echo "no GPU: skipped"; exit 77; fi
  cat "$out.eager.log"
  [ $rc -eq 0 ] || { echo "FAIL: the eager run exited $rc"; exit 1; }
  "$nt" "${args[@]}" --cuda-graph --out-dir "$out/graph" >"$out.graph.log" 2>&1
  rc=$?
  cat "$out.graph.log"
  [ $rc -eq 0 ] || { echo "FAIL: the graph run exited $rc"; exit 1; }
  grep -q "^done.*(CUDA graph)" "$out.graph.log" || { echo "FAIL: the step was not captured"; exit 1; }
  exec $compare "$out/graph" "$out/eager" --rtol 1e-6
  ;;
killed)
  n=$1
  log="$work/killed.log"
  start=$(date +%s)
  "$mpiexec" -np "$n" --oversubscribe --bind-to none "$nt" "${gpt[@]}" --max-iters 100000 \
      --batch-size 4 --sharding-strategy FULL_SHARD --dist-timeout 5 >"$log" 2>&1 &
  job=$!
  victim=""
  for _ in $(seq 1 100); do   # rank 1: the second child of mpirun, once all are up
    mapfile -t kids < <(pgrep -P "$job" | sort -n)
    if [ "${#kids[@]}" -ge "$n" ]; then victim=${kids[1]}; break; fi
    sleep 0.1
  done
  [ -n "$victim" ] || { kill "$job"; echo "FAIL: the ranks did not start"; exit 1; }
  sleep 2
  kill -9 "$victim"
  for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then kill "$job"; echo "FAIL: still running 30 s after the kill"; exit 1; fi
  wait "$job"
  rc=$?
  cat "$log"
  echo "mpirun exited $rc, $(( $(date +%s) - start )) s after the start"
  [ "$rc" -ne 0 ] || { echo "FAIL: exit status 0"; exit 1; }
  echo OK
  ;;
mismatch)
  args=("${gpt[@]}" --max-iters 3 --batch-size 4 --dist-timeout 10)
  "$mpiexec" --oversubscribe --bind-to none -np 1 "$nt" "${args[@]}" --lr 1e-3 : \
             -np 1 "$nt" "${args[@]}" --lr 2e-3 2>&1
  rc=$?
  echo "mpirun exited $rc"
  [ "$rc" -ne 0 ] || { echo "FAIL: exit status 0"; exit 1; }
  ;;
*)
  echo "unknown mode $mode"
  exit 2
  ;;
esac
