#!/usr/bin/env bash
# compute-sanitizer over the GPU op tests and a few training steps of the small GPT and the CNN:
# memcheck on every entry, then racecheck on the kernels that use shared memory, then initcheck
# on a few while time is left. Each run is bounded (SANITIZE_RUN_S, default 30 s) and the
# whole script by SANITIZE_BUDGET_S (default 240 s); a run that would not fit is listed as not
# run. SANITIZE_ONLY / SANITIZE_SKIP: space-separated tool:test pairs to run alone / leave out
# (e.g. SANITIZE_ONLY="racecheck:conv2d"). Writes $OUT/sanitize.md (test, tool, result, errors,
# seconds, then the kernels that made the reports) and each run's log under $OUT/sanitize/.
#   scripts/gpu_sanitize.sh [BUILD_DIR]     (default: build; configured for sm_90a and built
#                                            here when it has no nanotrain)
# Exit status: 0 every run finished with 0 errors; 1 some run reported errors or failed;
# 3 no errors, but some run timed out or was not run (the table says which).
# CUDA API errors are not counted (--report-api-errors no): some tests provoke them on purpose
# (out of memory, bad arguments) and every call's status is checked by the code itself.
# The pool's caching is off (NT_MEM_CACHE=0: every tensor its own cudaMalloc of exactly its
# size), so memcheck sees an access past any tensor's end, not only past a pooled segment's.
# GEMM autotuning and the widened search are off (NT_GEMM_AUTOTUNE=0, NT_GEMM_SEARCH=0): fewer
# cuBLASLt launches under the sanitizer's slow-down.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${OUT:-/tmp/nt-out}
logs=$out/sanitize
mkdir -p "$logs"
summary=$out/sanitize.md
budget=${SANITIZE_BUDGET_S:-240}
per_run=${SANITIZE_RUN_S:-30}
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
[[ -x $cs ]] || cs=$(command -v compute-sanitizer || true)
if [[ -z $cs || ! -x $cs ]]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER)" | tee "$summary"
  exit 1
fi
if [[ ! -x $build/nanotrain ]]; then
  echo "building $build (sm_90a) ..."
  scripts/build.sh "$build" -DNT_CUDA_ARCHS=90a >"$logs/build.log" 2>&1 ||
    { tail -20 "$logs/build.log"; exit 1; }
fi
export NT_GEMM_AUTOTUNE=0 NT_GEMM_SEARCH=0 NT_MEM_CACHE=0
# Races inside cuBLASLt's own kernels (nvjet_*, cutlass*, sm90_xmma*: not our code) are
# counted apart: racecheck reports hazards inside its split-K kernels. Leaving them out of the
# instrumentation (--kernel-name-exclude) made the sanitizer fail on them ("failed to handle a
# hardware exception"), so they run instrumented and their reports are sorted afterwards.
# memcheck and initcheck reports count whatever kernel made them: the memory is ours.
lib_kernels='(nvjet_|cutlass|sm90_xmma|sm80_xmma)'

# a Fashion-MNIST-shaped set of random images for the CNN: no dataset needed
fashion=$logs/fashion
bash tests/cli/fashion_like.sh "$fashion" 64 32 || exit 1

t=$build/tests
nt=$build/nanotrain
gpt=("$nt" gpt --device cuda --data synthetic --vocab-size 65 --n-layer 2 --n-head 2 --n-embd 128
     --block-size 64 --batch-size 4 --max-iters 3 --eval-interval 0 --dropout 0.1 --sample 0
     --no-cuda-graph --num-workers 1 --quiet)
cnn=("$nt" cnn --device cuda --data-dir "$fashion" --widths 8,16,32 --batch-size 16 --epochs 1
     --max-iters 3 --no-cuda-graph --num-workers 1 --quiet)
# name | command (words; the arrays above by name)
# the training steps first (they reach most kernels), the op tests after, the slowest last;
# --quick: the attention and NHWC convolution tests on a subset of cases that still reaches
# every kernel (the full tests take minutes under the sanitizer)
entries=(
  "gpt_bf16_3_steps|@gpt --dtype bf16"
  "cnn_fp16_3_steps|@cnn --dtype fp16"
  "layernorm|$t/gpu_test_layernorm"
  "cross_entropy|$t/gpu_test_cross_entropy"
  "embedding|$t/gpu_test_embedding"
  "dropout|$t/gpu_test_dropout"
  "adamw|$t/gpu_test_optim"
  "scaler|$t/gpu_test_scaler"
  "grad_scale|$t/gpu_test_grad_scale"
  "attention|$t/gpu_test_attention --quick"
  "conv2d|$t/gpu_test_conv2d"
  "conv2d_nhwc|$t/gpu_test_conv2d_nhwc --quick"
  "gpt_fp16_3_steps|@gpt --dtype fp16"
  "gpt_fp8_3_steps|@gpt --dtype fp8"
  "fp8_linear|$t/gpu_test_fp8_linear --quick"
  "gemm|$t/gpu_test_gemm"
)
racecheck_on=" attention conv2d_nhwc layernorm cross_entropy conv2d dropout embedding scaler adamw grad_scale gpt_bf16_3_steps cnn_fp16_3_steps fp8_linear gpt_fp8_3_steps "
initcheck_on=" layernorm cross_entropy embedding conv2d_nhwc attention gpt_bf16_3_steps cnn_fp16_3_steps "

start=$(date +%s)
kernel_notes=$logs/kernels.txt
: >"$kernel_notes"
errors_total=0 failed=0 incomplete=0
{
  echo "# compute-sanitizer ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "$("$cs" --version | tail -1); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  echo "Budget ${budget} s, at most ${per_run} s a run; NT_MEM_CACHE=0 NT_GEMM_AUTOTUNE=0" \
       "NT_GEMM_SEARCH=0. A racecheck run whose printed reports (at most 50) are all inside" \
       "cuBLASLt's kernels counts as ok."
  echo
  echo "| test | tool | result | errors | seconds |"
  echo "|---|---|---|---:|---:|"
} >"$summary"

run_one() {   # name tool words...
  local name=$1 tool=$2
  shift 2
  local left=$((budget - ($(date +%s) - start)))
  if ((left < 10)); then
    echo "| $name | $tool | not run (budget spent) | — | 0 |" >>"$summary"
    incomplete=$((incomplete + 1))
    return
  fi
  local limit=$((left < per_run ? left : per_run)) log=$logs/${name}_$tool.log
  local t0=$(date +%s)
  # initcheck prints every report, without backtraces, so that the kernels making them can
  # all be counted (its reports in the training steps number ~10^5)
  local print=(--print-limit 50)
  [[ $tool == initcheck ]] && print=(--print-limit 1000000 --show-backtrace no)
  timeout -k 5 "$limit" "$cs" --tool "$tool" --error-exitcode 99 "${print[@]}" \
    --report-api-errors no "$@" >"$log" 2>&1
  local rc=$? secs=$(($(date +%s) - t0))
  # the sanitizer's own count; a run cut short: the reports printed so far
  # ("ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards displayed (N errors,
  # W warnings)")
  local n
  n=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$')
  [[ -n $n ]] || n=$(grep -Eo 'RACECHECK SUMMARY: .*\([0-9]+ error' "$log" | tail -1 |
                       grep -Eo '[0-9]+ error' | grep -Eo '[0-9]+')
  if [[ -z $n ]]; then
    n=$(grep -Ec '^========= (Invalid|Race|Uninitialized|Error|Program hit|Warning: Race|Out-of-range|Misaligned|Malloc|Leaked|Barrier)' "$log")
  fi
  # printed reports, and those of them inside cuBLASLt's kernels
  local printed lib
  printed=$(grep -Ec '^========= (Error: Race|Warning: Race|Uninitialized|Invalid|Out-of-range|Misaligned)' "$log")
  lib=$(grep -Ec "^=========( Error: Race reported between [A-Za-z]+ access at|     at) (void )?$lib_kernels" "$log")
  local result
  case $rc in
  0) result=ok ;;
  99) result=ERRORS
      if [[ $tool == racecheck ]] && ((printed > 0 && lib == printed && n <= printed)); then
        result="ok: all $n in cuBLASLt's kernels"; n=0
      elif ((lib > 0)); then
        result="ERRORS ($lib of $printed printed in cuBLASLt's kernels)"
      fi ;;
  77) result="skipped (no GPU)"; incomplete=$((incomplete + 1)) ;;
  124|137) result="timed out after ${limit} s"; incomplete=$((incomplete + 1)) ;;
  *) result="FAILED (exit $rc)"; failed=$((failed + 1)) ;;
  esac
  errors_total=$((errors_total + n))
  echo "| $name | $tool | $result | $n | $secs |" >>"$summary"
  if ((n > 0)); then   # which kernels made the reports (the printed ones), for the notes below
    grep -A1 -E '^========= (Uninitialized|Invalid|Out-of-range|Misaligned)' "$log" |
      sed -n 's/^=========     at \(void \)\{0,1\}\(.*\)+0x[0-9a-f]*$/\2/p' | cut -c1-100 | sort | uniq -c |
      sort -rn | head -8 | while read -r count kernel; do
        echo "$name $tool: $count in \`$kernel\`" >>"$kernel_notes"
      done
  fi
  echo "$name $tool: $result, $n error(s), ${secs} s"
}

for tool in memcheck racecheck initcheck; do
  for e in "${entries[@]}"; do
    name=${e%%|*} cmd=${e#*|}
    [[ $tool == racecheck && $racecheck_on != *" $name "* ]] && continue
    [[ $tool == initcheck && $initcheck_on != *" $name "* ]] && continue
    [[ -n ${SANITIZE_ONLY:-} && " $SANITIZE_ONLY " != *" $tool:$name "* ]] && continue
    [[ " ${SANITIZE_SKIP:-} " == *" $tool:$name "* ]] && continue
    read -r -a words <<<"$cmd"
    case ${words[0]} in
    @gpt) words=("${gpt[@]}" "${words[@]:1}") ;;
    @cnn) words=("${cnn[@]}" "${words[@]:1}") ;;
    esac
    if [[ ! -x ${words[0]} ]]; then
      echo "| $name | $tool | FAILED (${words[0]} not built) | — | 0 |" >>"$summary"
      failed=$((failed + 1))
      continue
    fi
    run_one "$name" "$tool" "${words[@]}"
  done
done

{
  if [[ -s $kernel_notes ]]; then
    echo
    echo "Reports by kernel (printed reports):"
    echo
    sed 's/^/- /' "$kernel_notes"
  fi
  echo
  echo "Total: $errors_total error(s), $failed failed run(s), $incomplete run(s) timed out," \
       "skipped or not run; $(($(date +%s) - start)) s. Logs: sanitize/<test>_<tool>.log."
} >>"$summary"
cat "$summary"
((errors_total > 0 || failed > 0)) && exit 1
((incomplete > 0)) && exit 3
exit 0
