#!/usr/bin/env bash
# Data-parallel runs of nanotrain on one GPU (the H200), logs under $OUT:
#   scripts/gpu_dist.sh [all|nccl|mpi|gpt2|comm] [BUILD_DIR]
#   nccl   NCCL at world 1 under each strategy vs the one-process path (GPT small config,
#          50 steps, fp32 and bf16): losses and checkpoints compared
#   mpi    the MPI-staged device backend, 2 and 4 ranks sharing the GPU, each strategy, vs one
#          process with the same global batch (fp32 and bf16)
#   gpt2   GPT-2 124M at world 1: the one-process path and NO_SHARD / SHARD_GRAD_OP /
#          FULL_SHARD over NCCL, eager and with --cuda-graph (tokens/s, measured peak vs memest)
#   comm   bench/bench_comm (nccl-tests style algbw / busbw of all-reduce, reduce-scatter and
#          all-gather at our unit sizes and 64 KiB..256 MiB): NCCL over every GPU of the
#          machine (world 1 on one GPU), fp32 and bf16; the MPI-staged backend with 2 ranks
#          (device buffers through host memory); MPI on the CPU with 2 ranks up to 16 MiB
# The build must exist (scripts/gpu_batch.sh tests makes it; else this builds for sm_90a).
# Summary lines: $OUT/dist_summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
what=${1:-all}
build=${2:-build}
out=${OUT:-/tmp/nt-out}/dist
mkdir -p "$out"
export NT_DATA_DIR="$PWD/.data" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# NVLink multicast (NVLS) stays off on the lent machines of several GPUs
export NCCL_NVLS_ENABLE=0
nt="$PWD/$build/nanotrain"
if [ ! -x "$nt" ]; then
  scripts/build.sh "$build" -DNT_CUDA_ARCHS=90a > "$out/build.log" 2>&1 ||
    { grep -A5 error "$out/build.log" | head -40; exit 1; }
fi
sum="$out/dist_summary.txt"
[ "$what" = all ] && : > "$sum"   # a single part appends to the summary
note() { echo "$*" | tee -a "$sum"; }
compare() {  # run dir, reference dir, rtol, label
  local r
  r=$(python3 tests/dist_compare_runs.py "$1" "$2" --rtol "$3" 2>&1 | tail -3 | tr '\n' ' ')
  note "$4: $r"
}
# nanoGPT's shakespeare_char config (6 layers, 384 wide, block 256), no dropout (the ranks'
# dropout streams differ from one process's by design), 50 steps, no evaluation; AdamW's eps
# 1e-6 so the attention's key bias (zero gradient up to rounding) is not amplified by Adam
small=(gpt --device cuda --max-iters 50 --eval-interval 0 --log-interval 1 --no-progress --dropout 0
       --eps 1e-6)
tol() { [ "$1" = fp32 ] && echo 1e-4 || echo 3e-2; }   # fp32: GEMM order; bf16: rounding

if [ "$what" = all ] || [ "$what" = nccl ]; then
  for dt in fp32 bf16; do
    d="$out/nccl_$dt"
    rm -rf "$d"
    "$nt" "${small[@]}" --dtype "$dt" --out-dir "$d/ref" > "$d.ref.log" 2>&1 ||
      { note "nccl $dt reference failed"; continue; }
    note "nccl $dt reference: $(grep '^done' "$d.ref.log")"
    for s in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
      "$nt" "${small[@]}" --dtype "$dt" --sharding-strategy "$s" --dist-backend nccl \
          --out-dir "$d/$s" > "$d.$s.log" 2>&1 || { note "nccl $dt $s FAILED (exit $?)"; continue; }
      note "nccl $dt $s: $(grep '^done' "$d.$s.log")"
      compare "$d/$s" "$d/ref" "$(tol "$dt")" "nccl $dt $s vs one process"
    done
  done
fi

if [ "$what" = all ] || [ "$what" = mpi ]; then
  for dt in fp32 bf16; do
    d="$out/mpi_$dt"
    rm -rf "$d"
    "$nt" "${small[@]}" --dtype "$dt" --batch-size 64 --out-dir "$d/ref" --no-cuda-graph \
        > "$d.ref.log" 2>&1 || { note "mpi $dt reference failed"; continue; }
    for n in 2 4; do
      for s in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
        timeout 400 mpirun -np "$n" --oversubscribe --bind-to none "$nt" "${small[@]}" \
            --dtype "$dt" --device cuda:0 --dist-backend mpi --batch-size $((64 / n)) \
            --sharding-strategy "$s" --out-dir "$d/${s}_$n" > "$d.${s}_$n.log" 2>&1 ||
          { note "mpi $dt $s x$n FAILED (exit $?)"; tail -5 "$d.${s}_$n.log" >> "$sum"; continue; }
        note "mpi $dt $s x$n: $(grep '^done' "$d.${s}_$n.log")"
        compare "$d/${s}_$n" "$d/ref" "$(tol "$dt")" "mpi $dt $s x$n vs one process batch 64"
      done
    done
  done
fi

if [ "$what" = all ] || [ "$what" = gpt2 ]; then
  g2=(gpt --preset gpt2 --device cuda --dtype bf16 --batch-size 16 --max-iters 40
      --log-interval 10 --eval-interval 0 --no-progress)
  run_g2() {  # label, extra args...
    local label=$1; shift
    timeout 500 "$nt" "${g2[@]}" "$@" > "$out/gpt2_$label.log" 2>&1 ||
      { note "gpt2 $label FAILED (exit $?)"; tail -5 "$out/gpt2_$label.log" >> "$sum"; return; }
    note "gpt2 $label: $(grep '^done' "$out/gpt2_$label.log")"
    grep -E "estimate \(total\)|measured peak|^memory" "$out/gpt2_$label.log" | sed 's/^/    /' >> "$sum"
  }
  run_g2 one_process
  for s in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
    run_g2 "$s" --sharding-strategy "$s" --dist-backend nccl
  done
  # the FSDP runs above are eager (the default); the same with the forward + backward captured
  # as a CUDA graph over NCCL (--cuda-graph: the communicator's capture-aware wait path)
  for s in NO_SHARD SHARD_GRAD_OP FULL_SHARD; do
    run_g2 "${s}_graph" --sharding-strategy "$s" --dist-backend nccl --cuda-graph
  done
fi
if [ "$what" = all ] || [ "$what" = comm ]; then
  bc="$PWD/$build/bench/bench_comm"
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [ "$ngpu" -ge 1 ] || ngpu=1
  run_bc() {  # label, ranks, args...
    local label=$1 n=$2; shift 2
    timeout 500 mpirun -np "$n" --oversubscribe --bind-to none "$bc" "$@" \
        > "$out/comm_$label.log" 2>&1 ||
      { note "comm $label FAILED (exit $?)"; tail -5 "$out/comm_$label.log" >> "$sum"; return; }
    note "comm $label: $(head -1 "$out/comm_$label.log")"
    sed -n '/^case/,$p' "$out/comm_$label.log" | sed 's/^/    /' >> "$sum"
  }
  if [ ! -x "$bc" ]; then
    note "comm: $bc missing (build bench_comm)"
  else
    for dt in f32 bf16; do
      run_bc "nccl_${ngpu}gpu_$dt" "$ngpu" --device cuda --backend nccl --dtype "$dt"
    done
    run_bc mpi_staged_2ranks 2 --device cuda --backend mpi --max-bytes 64M
    run_bc mpi_cpu_2ranks 2 --device cpu --backend mpi --max-bytes 16M
  fi
fi
cat "$sum"
exit 0
