#!/usr/bin/env bash
# Where every millisecond of a training step goes, nanotrain beside PyTorch, per workload:
# nanotrain's kernels over NT_PROFILE_ITERS (nsys when the machine has it, else ncu's
# gpu__time_duration with --profile-from-start off), PyTorch's by torch.profiler
# (bench/profile_torch.py, the same model, batch and step as bench_train.py), grouped into the
# step's parts by bench/profile_kernels.py into one markdown table per workload, with each
# side's largest kernels. nanotrain runs eagerly here (--no-cuda-graph: one kernel per launch
# for the profilers); when $OUT/bench_train.json (bench/run_train.sh's) exists, its measured
# step times add the "outside kernels" row (launch gaps, host work, idle GPU).
#   OUT=/path bench/profile_step.sh [gpt-char,gpt2,cnn]
# Env: BUILD (build), PROFILER (auto|nsys|ncu), ITERS (profiled steps, 2), CACHE (ncu's
# --cache-control: all, the default, flushes the caches before every kernel; none keeps the L2
# warm as in a real step, which matters for the small GPT's 12.6 MB activations),
# TORCH_GPT (compile), TORCH_CNN (gpu-compile): the torch variants profiled; NT_ARGS / TORCH_ARGS: more arguments
# for nanotrain / profile_torch.py (a CPU smoke run: NT_ARGS="--device cpu ..." TORCH_ARGS=
# "--device cpu --tiny"). About 4 minutes on an H200 (mostly torch.compile). Writes
# $OUT/profile_step.md and the raw logs beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
out=${OUT:-/tmp/nt-profile}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
if [[ ! -x "$BUILD/nanotrain" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DNT_CUDA_ARCHS="${NT_CUDA_ARCHS:-90a}" >/dev/null &&
    ninja -C "$BUILD" nanotrain >/dev/null || { echo "profile_step.sh: build failed" >&2; exit 1; }
fi
[[ -z "${NT_DATA_DIR:-}" && -f .data/tinyshakespeare.txt ]] && export NT_DATA_DIR="$PWD/.data"
[[ -z "${NT_FASHION_DIR:-}" && -d .data/fashion-mnist ]] && export NT_FASHION_DIR="$PWD/.data/fashion-mnist"
fashion=${NT_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
iters=${ITERS:-2}
from=6
to=$((from + iters))
profiler=${PROFILER:-auto}
if [[ $profiler == auto ]]; then
  if command -v nsys >/dev/null; then profiler=nsys; else profiler=ncu; fi
fi
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
report="$out/profile_step.md"
tmp=$(mktemp -d)   # nanotrain's checkpoints stay out of $OUT
trap 'rm -rf "$tmp"' EXIT
{ echo "## Where a training step's GPU time goes ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "nanotrain: $profiler over $iters eager steps (NT_PROFILE_ITERS=$from:$to; ncu caches:"
  echo "${CACHE:-all}); torch:"
  echo "torch.profiler over $iters steps of bench_train.py's variant; ms per step."
  echo; } > "$report"

nt_args() {  # the workload's nanotrain command line, as bench_train.py builds it
  case $1 in
  gpt-char) echo gpt --dtype bf16 --batch-size 64 --eval-interval 0 \
              $([[ -f "${NT_DATA_DIR:-}/tinyshakespeare.txt" ]] || echo --data synthetic) ;;
  gpt2) echo gpt --preset gpt2 --batch-size 16 --dtype bf16 --data synthetic --eval-interval 0 ;;
  cnn) echo cnn --dtype fp16 --batch-size 256 --epochs 1000 --data-dir "$fashion" ;;
  esac
}

step_ms() {  # workload, side (nanotrain or a torch variant): the bench's median, if any
  python3 - "$out/bench_train.json" "$1" "$2" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))["results"][sys.argv[2]]
x = r["nanotrain"] if sys.argv[3] == "nanotrain" else r["torch"][sys.argv[3]]
print(f"{x['step_ms']:.4f}")
PY
}

IFS=, read -ra workloads <<< "${1:-gpt-char,gpt2,cnn}"
for w in "${workloads[@]}"; do
  echo "== $w ($profiler)"
  # shellcheck disable=SC2046
  cmd=("$BUILD/nanotrain" $(nt_args "$w") --max-iters $((to + 2)) --log-interval 100
       --no-cuda-graph --no-progress --out-dir "$tmp/run_$w" ${NT_ARGS:-})
  nt_csv="$out/nanotrain_$w.csv"
  if [[ $profiler == nsys ]]; then
    NT_PROFILE_ITERS=$from:$to nsys profile -t cuda --capture-range=cudaProfilerApi \
      --capture-range-end=stop -f true -o "$out/nanotrain_$w" "${cmd[@]}" > "$out/nanotrain_$w.log" 2>&1
    nsys stats --report cuda_gpu_kern_sum --format csv --output - \
      "$out/nanotrain_$w.nsys-rep" > "$nt_csv" 2>>"$out/nanotrain_$w.log" ||
      nsys stats --report gpukernsum --format csv --output - \
        "$out/nanotrain_$w.nsys-rep" > "$nt_csv" 2>>"$out/nanotrain_$w.log"
  else
    NT_PROFILE_ITERS=$from:$to "$NCU" --profile-from-start off --clock-control none \
      --cache-control "${CACHE:-all}" \
      --metrics gpu__time_duration.sum --csv "${cmd[@]}" > "$nt_csv" 2> "$out/nanotrain_$w.log"
  fi
  [[ $w == cnn ]] && tv=${TORCH_CNN:-gpu-compile} || tv=${TORCH_GPT:-compile}
  pt_csv="$out/torch_$w.csv"
  python3 bench/profile_torch.py --workload "$w" --variant "$tv" --iters "$iters" \
    --fashion-dir "$fashion" --csv "$pt_csv" ${TORCH_ARGS:-} > "$out/torch_$w.log" 2>&1 ||
    echo "profile_torch.py $w failed: see $out/torch_$w.log"
  sides=()
  [[ -s $nt_csv ]] && sides+=(--side "nanotrain=$nt_csv:$iters") ||
    echo "nanotrain $w: no profile (see $out/nanotrain_$w.log)"
  [[ -s $pt_csv ]] && sides+=(--side "torch $tv=$pt_csv:1")
  steps=()
  s=$(step_ms "$w" nanotrain) && [[ -n $s ]] && steps+=(--step-ms "nanotrain=$s")
  s=$(step_ms "$w" "$tv") && [[ -n $s ]] && steps+=(--step-ms "torch $tv=$s")
  if (( ${#sides[@]} )); then
    python3 bench/profile_kernels.py "${sides[@]}" ${steps[@]+"${steps[@]}"} --title "$w" \
      >> "$report" ||
      echo "profile_kernels.py $w failed"
    echo >> "$report"
  fi
done
cat "$report"
