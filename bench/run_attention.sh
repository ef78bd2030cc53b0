#!/usr/bin/env bash
# Causal attention, bf16: nanotrain's kernels (bench_attention) next to torch's
# scaled_dot_product_attention (bench_attention.py) on the same rows (two plain shapes, the
# small GPT's with dropout 0.2, with q/k/v as views of the [B, T, 3C] projection output, and
# GPT-2's with dropout 0.1),
# tables with the ratio torch_ms / nanotrain_ms (>= 1.00 means nanotrain is at least as fast),
# then our other kernel variants and, unless "noprof", Nsight Compute's view of T = 1024.
# Usage: bench/run_attention.sh [build-dir] [repeats] [noprof]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
reps="${2:-30}"
bin="$build/bench/bench_attention"
if [ ! -x "$bin" ]; then
  echo "run_attention.sh: $bin not found (build first: cmake --build $build)" >&2
  exit 1
fi

# One table per timing: one call per sample (the host's launch latency, torch's Python and
# autograd included) and 10 calls back to back per sample (GPU time per call, the GPU queue kept
# full as in a training step).
for calls in 1 10; do
  echo "== $calls call(s) per timed sample"
  out_nt="$("$bin" "$reps" -1 "$calls")"
  echo "$out_nt" | grep -v '^RESULT'
  echo
  out_pt="$(python3 "$here/bench_attention.py" --repeats "$reps" --calls "$calls" 2>&1)" ||
    { echo "$out_pt" >&2; out_pt=""; }
  echo "$out_pt" | grep -v '^RESULT' || true
  echo
  printf '%s\n%s\n' "$out_nt" "$out_pt" | awk -v calls="$calls" '
    $1 == "RESULT" { key = $3; v[$2, key, 1] = $4; v[$2, key, 2] = $5; v[$2, key, 3] = $6;
                     if (!(key in seen)) { seen[key] = 1; order[n++] = key } }
    END {
      printf "%-26s | %-25s | %-25s | %-25s\n", "B,H,T,D (bf16), " calls " call(s)",
             "forward ms nt/torch (x)", "backward ms nt/torch (x)", "fwd+bwd ms nt/torch (x)"
      for (i = 0; i < n; i++) {
        k = order[i]; line = sprintf("%-26s", k)
        for (j = 1; j <= 3; j++) {
          a = v["nt", k, j]; b = v["torch", k, j]
          r = (a > 0 && b > 0) ? sprintf("%.2f", b / a) : "-"
          line = line sprintf(" | %8s %8s %6s", a == "" ? "-" : a, b == "" ? "-" : b, r)
        }
        print line
      }
    }'
  echo
done

echo
echo "variants, ms:                                  fwd      bwd  fwd+bwd"
# NT_ATTN_WGMMA=0 (the context option attn_wgmma, which bench_attention maps from the
# environment): the mma.sync kernels (the default before the Hopper wgmma ones for D = 64);
# NT_ATTN_TMA=0: the wgmma kernels' cp.async loads; the backward adding into the old gradients
# (+=) instead of writing fresh ones (the tables above, like torch.autograd.grad).
for var in NT_ATTN_WGMMA=0 NT_ATTN_TMA=0 NT_ATTN_BENCH_ACCUMULATE=1; do
  for row in 0 1; do   # the plain shapes (dropout runs the default kernels only)
    env "$var" "$bin" "$reps" "$row" | awk -v var="$var" '$1 == "RESULT" {
      printf "  %-22s %-18s %8s %8s %8s\n", var, $3, $4, $5, $6 }'
  done
done

# Where the time goes at T = 1024, when Nsight Compute is installed and may read the counters
# (third argument "noprof" skips it): duration, throughputs, occupancy and warp stall reasons of
# the first forward and backward kernels, durations of the backward's helper passes. Full
# report in $build/attention_ncu.txt.
if [ "${3:-}" != "noprof" ] && command -v ncu > /dev/null; then
  rep="$build/attention_ncu.txt"
  : > "$rep"
  for k in fwd_wg_kernel bwd_wg_kernel 'prep_rows_vec|dq_tiles_finish|dq_finish'; do
    sections="--section SpeedOfLight"
    case "$k" in *_kernel) sections="$sections --section Occupancy --section WarpStateStats \
--section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats" ;; esac
    # shellcheck disable=SC2086
    timeout 180 ncu --kernel-name "regex:$k" --launch-count 2 $sections "$bin" 1 1 \
      >> "$rep" 2>&1 || echo "run_attention.sh: ncu on $k failed (see $rep)" >&2
  done
  echo
  echo "Nsight Compute, B 16 H 12 T 1024 (full report: $rep):"
  keep='Context [0-9]+, Stream|Duration|Registers Per|Achieved Occupancy|Theoretical Occ'
  keep="$keep|Compute \\(SM\\) Th|Memory Throughput|Executed Ipc A|Warp Cycles Per Issued"
  keep="$keep|No Eligible|stalled|ERR"
  grep -E "$keep" "$rep" | cut -c1-160 | head -100 || true
fi
