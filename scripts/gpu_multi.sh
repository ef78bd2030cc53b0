#!/usr/bin/env bash
# Data-parallel runs of nanotrain over the N GPUs of one host (2, 4 or 8 H200s), ranks launched
# by `mpirun -np N`, each rank on the GPU of its local rank; logs under $OUT/multi:
#   scripts/gpu_multi.sh [--cpu] [--part 1|2] [N] [BUILD_DIR]
#   N: the GPUs to use (default: every GPU nvidia-smi -L lists); --cpu: CPU ranks (N = 2);
#   --part: only part 1 or 2 (the device runs a command for at most 10 minutes)
# 1. correctness: per strategy, one process training the global batch (per-rank batch x N) vs
#    N ranks: the GPT small config fp32 (losses and final checkpoint, rtol $FP32_RTOL) and
#    bf16, GPT-2 124M bf16 (losses, rtol $BF16_RTOL), 50 steps; the N ranks' consolidated
#    checkpoint of step $SAVE resumed by one process and by N/2 ranks up to the last step: it
#    must start at step SAVE+1 and match the run that kept N ranks (tests/dist_compare_runs.py)
# 2. scaling: GPT-2 124M tokens/s at 1, 2, 4, 8 GPUs (<= N) per strategy, weak scaling (16 x
#    1024 tokens per GPU), --cuda-graph; efficiency = tokens/s(n) / (n x tokens/s(1)); each
#    rank's measured peak vs memest (the end-of-run lines, not --trace: it reads the GPU
#    every step and would slow the runs being timed). After nanotrain's runs at each n, PyTorch's
#    at the same n (bench/bench_dist_torch.py under torchrun: the same model, batch and dtype,
#    timed with CUDA events over windows after warm-up): $TORCH_VARIANTS, default DDP, FSDP2
#    FULL_SHARD-like and FSDP2 SHARD_GRAD_OP-like (eager), then, once every n is done, DDP with
#    torch.compile at each n; efficiency against torch's own 1-GPU figure, peak per rank
#    (torch.cuda.max_memory_allocated). A torch run that would start past $TORCH_BUDGET_S
#    seconds from the script's start (default 540: the device's 10-minute command, with
#    `--part 2`; 0: no limit) is skipped and listed as SKIP, and none runs past it; without
#    torch (python3 -c "import torch") the torch rows are left out, with a note.
# --cpu: the same steps with --device cpu, mpirun --oversubscribe, N = 2, a tiny GPT (2 layers,
#    32 wide, block 32), 20 steps, fp32 only (so N/2 = 1: one process and one FSDP rank);
#    the torch rows (when torch is importable): --device cpu --tiny (gloo, bench_train.py's
#    tiny GPT-2 shapes, not nanotrain's tiny GPT), eager only, no budget: a smoke check.
# Summary: $OUT/multi_summary.md (logs and runs in $OUT/multi), PASS/FAIL per check; exits 1
# when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
cpu=0 part=all
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=1 ;;
    --part) part=$2; shift ;;
    *) break ;;
  esac
  shift
done
n_arg=${1:-}
build=${2:-build}
out=${OUT:-/tmp/nt-out}/multi
mkdir -p "$out"
export NT_DATA_DIR="${NT_DATA_DIR:-$PWD/.data}" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# NVLink multicast (NVLS) stays off on the lent machines of several GPUs (every run)
export NCCL_NVLS_ENABLE=0
nt="$PWD/$build/nanotrain"
cmp_py="$PWD/tests/dist_compare_runs.py"
if [ ! -x "$nt" ]; then
  [ $cpu = 1 ] && { echo "$nt missing: scripts/build.sh $build -DNT_CUDA=OFF"; exit 1; }
  scripts/build.sh "$build" -DNT_CUDA_ARCHS=90a > "$out/build.log" 2>&1 ||
    { grep -A5 error "$out/build.log" | head -40; exit 1; }
fi
python3 -c "import numpy" 2>/dev/null || { echo "numpy missing (tests/dist_compare_runs.py)"; exit 1; }

# Tolerances. fp32: 1e-5 on the CPU, as tests/dist_nanotrain.sh (summation order only); 1e-4
# on GPUs, what scripts/gpu_dist.sh needed for world-1 NCCL against one process on the H200
# (cuBLASLt may pick other GEMM kernels for the one process's larger batch). bf16:
# docs/tolerances.md's bound for a whole bf16 training curve against fp32 (test_amp_train:
# measured 0.0131 worst relative loss gap, CPU and H200 alike, bound 0.026 = 2x); N ranks and one
# process in bf16 differ only in reduction order and GEMM shapes, less than bf16 differs from fp32.
FP32_RTOL=1e-4
[ $cpu = 1 ] && FP32_RTOL=1e-5
BF16_RTOL=2.6e-2
strategies=(NO_SHARD SHARD_GRAD_OP FULL_SHARD)
if [ $cpu = 1 ]; then
  N=2 steps=20 SAVE=15 tmo=300
  mpi_flags=(--oversubscribe --bind-to none)
  export OPENBLAS_NUM_THREADS=1
  common=(gpt --device cpu --dropout 0 --eps 1e-6 --no-progress --num-workers 0 --eval-interval 0
          --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --data synthetic --vocab-size 64)
  configs=("tiny fp32 4")              # model, dtype, per-rank batch
  scale=(--batch-size 4 --max-iters 20 --log-interval 5)
  scale_sizes=(1 2)
  torch_def="ddp fsdp2-full fsdp2-grad-op" budget_def=0
  torch_args=(--device cpu --tiny --windows 3 --window 2 --skip 1)
else
  N=${n_arg:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  steps=50 SAVE=40 tmo=600
  mpi_flags=(--bind-to none)
  # nanoGPT's shakespeare_char config, no dropout (the ranks' streams differ from one
  # process's by design), AdamW eps 1e-6 (keeps the key bias's rounding noise small)
  common=(gpt --device cuda --dropout 0 --eps 1e-6 --no-progress --eval-interval 0)
  configs=("small fp32 8" "small bf16 8" "gpt2 bf16 4")
  scale=(--dtype bf16 --batch-size 16 --max-iters 40 --log-interval 10
         --cuda-graph)
  scale_sizes=()
  for n in 1 2 4 8; do [ "$n" -le "$N" ] && scale_sizes+=("$n"); done
  torch_def="ddp fsdp2-full fsdp2-grad-op ddp+compile" budget_def=540
  # 2 warm-up windows (compilation happens there), 5 timed windows of 10 steps
  torch_args=(--device cuda --windows 5 --window 10 --skip 2)
fi
# the torch variants of part 2: WRAP or WRAP+compile (bench_dist_torch.py --wrap WRAP)
read -ra torch_variants <<< "${TORCH_VARIANTS-$torch_def}"
TORCH_BUDGET_S=${TORCH_BUDGET_S:-$budget_def}
[ "$N" -ge 2 ] 2>/dev/null || { echo "need N >= 2 ranks (got '$N')"; exit 1; }
half=$((N / 2))
echo "gpu_multi: $([ $cpu = 1 ] && echo "CPU ranks" || echo GPUs), N = $N, logs in $out"

fails=0
rows1=() rows2=() rows3=()
# row ARRAY RC TEXT: appends "TEXT | PASS|FAIL |" to ARRAY (a table row), counting failures
row() {
  local -n rows=$1
  local v=PASS
  [ "$2" = 0 ] || { v=FAIL; fails=$((fails + 1)); }
  rows+=("$3 | $v |")
}
# why a run failed: the program's first error line, else the log's last line
why() { { grep -m1 '^nanotrain:' "$1" || tail -1 "$1"; } | tr '|' '/'; }
# launch RANKS LOG ARGS...: RANKS 0 is one process without FSDP (the reference path); else
# mpirun -np RANKS (1 included: the FSDP runtime at world 1)
launch() {
  local n=$1 log=$2; shift 2
  if [ "$n" = 0 ]; then
    timeout "$tmo" "$nt" "$@" > "$log" 2>&1
  else
    timeout "$tmo" mpirun -np "$n" "${mpi_flags[@]}" -x NCCL_NVLS_ENABLE "$nt" "$@" > "$log" 2>&1
  fi
}
# loss of the last train record and the first step logged: "FIRST LAST_LOSS"
run_facts() {
  python3 - "$1/metrics.jsonl" <<'PY' 2>/dev/null || echo "- -"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
r = [x for x in r if x.get("kind") == "train"]
print(r[0]["step"], "%.5f" % r[-1]["loss"])
PY
}
# compare RUN REF RTOL [ARGS...]: dist_compare_runs.py; prints "RC|its summary on one line"
compare() {
  local run=$1 ref=$2 rtol=$3; shift 3
  local res rc
  res=$(python3 "$cmp_py" "$run" "$ref" --rtol "$rtol" "$@" 2>&1); rc=$?
  echo "$res" > "$run.compare.log"
  # the losses' line, then the verdict (OK or FAIL: ...); the details stay in RUN.compare.log
  res=$( (echo "$res" | grep 'losses compared'; echo "$res" | tail -1) | tr '\n' ' ' | tr '|' '/')
  echo "$rc|${res% }"
}
model_args() {  # MODEL: the arguments of the config
  case $1 in
    tiny) echo "${common[@]}" ;;
    small) echo "${common[@]}" "$([ -f "$NT_DATA_DIR/tinyshakespeare.txt" ] ||
                                  echo --data synthetic --vocab-size 65)" ;;
    gpt2) echo "${common[@]}" --preset gpt2 ;;
  esac
}

# ---- 1. correctness and resume ----
[ "$part" = 2 ] && configs=()
for cfg in "${configs[@]}"; do
  read -r model dt b <<< "$cfg"
  read -ra margs <<< "$(model_args "$model")"
  margs+=(--dtype "$dt" --max-iters "$steps" --log-interval 1)
  if [ "$dt" = fp32 ]; then tol=$FP32_RTOL; extra=(); else tol=$BF16_RTOL; extra=(--losses-only); fi
  d="$out/${model}_$dt"
  rm -rf "$d"; mkdir -p "$d"
  # the reference: one process, the global batch
  launch 0 "$d/ref.log" "${margs[@]}" --batch-size $((b * N)) --out-dir "$d/ref"
  rc=$?
  read -r _ loss <<< "$(run_facts "$d/ref")"
  row rows1 $rc "| $model $dt | 1 process | - | $((b * N)) | $loss | reference run (exit $rc)"
  [ $rc = 0 ] || continue
  for s in "${strategies[@]}"; do
    r="$d/$s"
    launch "$N" "$r.log" "${margs[@]}" --batch-size "$b" --sharding-strategy "$s" \
        --checkpoint-interval "$SAVE" --keep-checkpoints 0 --checkpoint-format consolidated \
        --out-dir "$r"
    rc=$?
    if [ $rc != 0 ]; then
      row rows1 1 "| $model $dt | $N ranks | $s | $b x $N | - | exit $rc: $(why "$r.log")"
      continue
    fi
    read -r _ loss <<< "$(run_facts "$r")"
    IFS='|' read -r rc res <<< "$(compare "$r" "$d/ref" "$tol" "${extra[@]}")"
    row rows1 "$rc" "| $model $dt | $N ranks | $s | $b x $N | $loss | vs reference, rtol $tol: $res"
    # resume the N ranks' checkpoint of step SAVE: one process, then N/2 ranks (same strategy)
    for m in 0 "$half"; do
      if [ "$m" = 0 ]; then who="1 process" sarg=(); bb=$((b * N)); else
        who="$m rank$([ "$m" -gt 1 ] && echo s)" sarg=(--sharding-strategy "$s"); bb=$((b * N / m)); fi
      rr="$d/${s}_resume_$m"
      launch "$m" "$rr.log" "${margs[@]}" --batch-size "$bb" "${sarg[@]}" \
          --resume "$r/ckpt-$SAVE" --out-dir "$rr"
      rc=$?
      read -r first loss <<< "$(run_facts "$rr")"
      if [ $rc != 0 ] || [ "$first" != $((SAVE + 1)) ]; then
        row rows3 1 "| $model $dt | $s | $N ranks -> $who | $first | - | exit $rc, first step $first (want $((SAVE + 1))): $(why "$rr.log")"
        continue
      fi
      IFS='|' read -r rc res <<< "$(compare "$rr" "$r" "$tol" --first-step $((SAVE + 1)) "${extra[@]}")"
      row rows3 "$rc" "| $model $dt | $s | $N ranks -> $who | $first | $loss | vs the $N ranks kept, rtol $tol: $res"
    done
    rm -rf "$r"/ckpt-* "$d/${s}"_resume_*/ckpt-*   # compared; GPT-2's are 1.5 GB each
  done
  rm -rf "$d"/ref/ckpt-*
done

# ---- 2. scaling (weak: the per-rank batch fixed) ----
tok_s() {  # median tokens/s of the logged steps after the first (warm-up, graph capture)
  python3 - "$1/metrics.jsonl" <<'PY' 2>/dev/null || echo 0
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])]
v = [x["tokens_per_sec"] for x in r if x.get("kind") == "train"][1:]
print("%.0f" % statistics.median(v))
PY
}
mem_of() {  # "r0 peak/memest r1 ..." (MiB) from the end-of-run lines
  local l
  l=$(sed -n 's/^rank \([0-9]*\): measured peak \([0-9.]*\) MiB, memest \([0-9.]*\) MiB.*/r\1 \2\/\3/p' "$1" | paste -sd' ')
  if [ -z "$l" ]; then   # world 1 prints only the table
    l="r0 $(awk '/^  measured peak/{p=$3} /^  estimate \(total\)/{e=$3} END{print p "/" e}' "$1")"
  fi
  echo "$l"
}
[ "$part" = 1 ] && scale_sizes=()
read -ra sargs <<< "$(model_args "$([ $cpu = 1 ] && echo tiny || echo gpt2)")"
[ $cpu = 1 ] && sargs+=(--dtype fp32)
# the table's rows by name (a strategy or "torch VARIANT") and ranks, printed name by name
declare -A srow sbase
names=("${strategies[@]}")
row2() {  # row2 NAME N RC|SKIP TEXT
  local v=PASS
  case $3 in 0) ;; SKIP) v=SKIP ;; *) v=FAIL; fails=$((fails + 1)) ;; esac
  srow[$1.$2]="| $1 | $2 | $4 | $v |"
}
# efficiency of T tokens/s at N ranks against BASE at 1
eff_of() { awk -v t="$1" -v b="$2" -v n="$3" 'BEGIN{ if (b > 0) printf "%.3f", t / (n * b); else print "-" }'; }
scale_nt() {  # scale_nt STRATEGY N: nanotrain's run
  local s=$1 n=$2 r="$out/scale_$1_$2" rc t mem nmem ok
  rm -rf "$r"
  launch "$n" "$r.log" "${sargs[@]}" "${scale[@]}" --sharding-strategy "$s" --out-dir "$r"
  rc=$?
  if [ $rc != 0 ]; then
    row2 "$s" "$n" 1 "- | - | exit $rc: $(why "$r.log")"; return
  fi
  t=$(tok_s "$r")
  [ "$n" = 1 ] && sbase[$s]=$t
  mem=$(mem_of "$r.log")
  nmem=$(echo "$mem" | grep -o '/' | wc -l)
  ok=1; [ "$t" -gt 0 ] 2>/dev/null && [ "$nmem" = "$n" ] && ok=0
  row2 "$s" "$n" $ok "$t | $(eff_of "$t" "${sbase[$s]:-0}" "$n") | $mem"
  rm -rf "$r"/ckpt-*   # GPT-2's checkpoints: 1.5 GB each, not needed
}
# torch's runs: bench/bench_dist_torch.py under torchrun (python3 -m torch.distributed.run,
# what the torchrun command runs), one process per GPU; its JSON gives the row
torch_ok=0 torch_note=""
if [ ${#torch_variants[@]} -gt 0 ] && [ ${#scale_sizes[@]} -gt 0 ]; then
  if python3 -c "import torch" 2>/dev/null; then
    torch_ok=1
    for v in "${torch_variants[@]}"; do names+=("torch $v"); done
  else
    torch_note="torch is not importable by python3: the torch rows are left out."
    echo "gpu_multi: $torch_note"
  fi
fi
# why a torch run failed: a rank's first exception line (or argparse's error), not torchrun's
# own ChildFailedError; else the log's last line
torch_why() {
  { grep -v ChildFailedError "$1" | grep -m1 -E '^[A-Za-z_.]*(Error|Exception)(: |$)|: error: ' ||
    tail -1 "$1"; } | cut -c1-200 | tr '|' '/'
}
scale_torch() {  # scale_torch VARIANT N
  local v=$1 n=$2 r="$out/scale_torch_${1/+/_}_$2" left lim t mem flags=() res rc
  local name="torch $v"
  if [ "$TORCH_BUDGET_S" -gt 0 ]; then
    left=$((TORCH_BUDGET_S - SECONDS))
    if [ "$left" -lt 30 ]; then
      row2 "$name" "$n" SKIP "- | - | not run: past TORCH_BUDGET_S=$TORCH_BUDGET_S s"; return
    fi
    [ "$left" -lt "$tmo" ] && lim=$left || lim=$tmo
  else
    lim=$tmo
  fi
  [[ $v == *+compile ]] && flags=(--compile)
  rm -f "$r.json"
  timeout "$lim" python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
    bench/bench_dist_torch.py --wrap "${v%+compile}" "${flags[@]}" "${torch_args[@]}" \
    --json "$r.json" > "$r.log" 2>&1
  rc=$?
  if grep -q '; skipped$' "$r.log"; then   # a wrapper this torch cannot run on the CPU
    row2 "$name" "$n" SKIP "- | - | $(grep -m1 '; skipped$' "$r.log" | sed 's/^[^:]*: //' | tr '|' '/')"
    return
  fi
  if [ $rc != 0 ] || [ ! -s "$r.json" ]; then
    row2 "$name" "$n" 1 "- | - | exit $rc$([ $rc = 124 ] && echo " (timeout $lim s)"): $(torch_why "$r.log")"
    return
  fi
  # "TOKENS/S PEAKS": peaks as mem_of's "r0 MiB r1 MiB ..." ("-" where not measured: CPU)
  res=$(python3 - "$r.json" "$n" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
p = r["peak_mib"]
ok = r["world_size"] == int(sys.argv[2]) and len(p) == r["world_size"] and r["tokens_per_s"] > 0
print("%.0f" % r["tokens_per_s"] if ok else 0,
      " ".join("r%d %s" % (k, "-" if x is None else "%.0f" % x) for k, x in enumerate(p)))
PY
)
  read -r t mem <<< "$res"
  [ "$n" = 1 ] && sbase[$name]=$t
  rc=1; [ "${t:-0}" -gt 0 ] 2>/dev/null && rc=0
  row2 "$name" "$n" $rc "${t:--} | $(eff_of "${t:-0}" "${sbase[$name]:-0}" "$n") | ${mem:-}"
}
for n in "${scale_sizes[@]}"; do
  for s in "${strategies[@]}"; do scale_nt "$s" "$n"; done
  [ $torch_ok = 1 ] || continue
  for v in "${torch_variants[@]}"; do [[ $v == *+compile ]] || scale_torch "$v" "$n"; done
done
# the compiled variants last: compilation is the slowest part, the first the budget drops
if [ $torch_ok = 1 ]; then
  for v in "${torch_variants[@]}"; do
    [[ $v == *+compile ]] || continue
    for n in "${scale_sizes[@]}"; do scale_torch "$v" "$n"; done
  done
fi
for name in "${names[@]}"; do
  for n in "${scale_sizes[@]}"; do
    [ -n "${srow[$name.$n]:-}" ] && rows2+=("${srow[$name.$n]}")
  done
done

# ---- summary ----
sum="${OUT:-/tmp/nt-out}/multi_summary.md"
{
  echo "# gpu_multi.sh: $([ $cpu = 1 ] && echo "CPU ranks (--cpu)" || echo "$N GPUs"), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "## 1. Correctness: $N ranks vs one process with the global batch ($steps steps)"
  echo
  echo "| model dtype | run | strategy | batch | final loss | check | result |"
  echo "|---|---|---|---|---:|---|---|"
  printf '%s\n' "${rows1[@]}"
  echo
  echo "## 1b. Resume: the $N ranks' consolidated checkpoint of step $SAVE, continued to step $steps"
  echo
  echo "| model dtype | strategy | ranks | first step | final loss | check | result |"
  echo "|---|---|---|---:|---:|---|---|"
  printf '%s\n' "${rows3[@]}"
  echo
  echo "## 2. Scaling (weak, ${scale[*]})"
  echo
  echo "efficiency = tokens/s(n) / (n x tokens/s(1)), each row against its own 1-rank figure;"
  echo "memory: per rank, measured peak / memest (MiB), from the end-of-run lines (--trace not used:"
  echo "it syncs every step). Check: the run completed and every rank reported its peak."
  if [ $torch_ok = 1 ]; then
    echo "torch rows: bench/bench_dist_torch.py ${torch_args[*]} under torchrun (global tokens/s,"
    echo "the median window, each window its slowest rank's); memory: torch.cuda.max_memory_allocated"
    echo "per rank over the timed windows, less the pre-built batches (no memest; - on the CPU)."
    [ $cpu = 1 ] && echo "On the CPU the torch rows run bench_train.py's tiny GPT-2 shapes, not nanotrain's tiny GPT."
  fi
  [ -n "$torch_note" ] && echo "$torch_note"
  echo
  echo "| strategy | ranks | tokens/s | efficiency | peak / memest per rank | result |"
  echo "|---|---:|---:|---:|---|---|"
  printf '%s\n' "${rows2[@]}"
  echo
  echo "failed checks: $fails"
} > "$sum"
cat "$sum"
[ "$fails" = 0 ]
