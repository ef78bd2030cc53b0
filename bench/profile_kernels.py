#!/usr/bin/env python3
"""Where a training step's GPU time goes, from kernel-time logs.

One log, summed by kernel name (as before):
  python3 bench/profile_kernels.py ncu.csv [iterations]
Several sides, grouped into the step's parts (GEMM, attention, LayerNorm, ...) side by side,
then each side's largest kernels; markdown:
  python3 bench/profile_kernels.py --side nanotrain=nt_ncu.csv:2 --side torch=torch.csv:1 \
      [--step-ms nanotrain=5.10 --step-ms torch=7.05] [--top 12] [--title TEXT]
A log is any of: `ncu --csv --metrics gpu__time_duration.sum` output; `nsys stats --report
cuda_gpu_kern_sum --format csv` output; profile_torch.py's --csv (already per iteration: give
1). ITERS divides the totals (the profiled range's iterations). --step-ms (the measured step,
e.g. from bench_train.py) adds the time outside kernels: launch gaps, host work, idle GPU (with
ncu's serialised kernels this is an estimate)."""
import argparse
import csv
import re
import sys
from collections import defaultdict

# The step's parts, first match wins (kernel names lower-cased): nanotrain's kernels, cuBLAS(Lt)
# / cuDNN / CUTLASS, PyTorch's ATen kernels and Inductor's Triton kernels.
PARTS = [
    ("attention", r"attn|attention|flash|fmha|sdpa|(^|[^a-z])(fwd|bwd)(_wg)?_kernel|"
                  r"dq_(tiles_)?finish|prep_rows|row_dot|simple_(forward|backward)"),
    ("convolution", r"conv|fprop|dgrad|wgrad|im2col|col2im|winograd|implicit|pack_weight|"
                    r"gather_dy"),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|wgmma|(^|[^a-z])(b?mm|addmm|matmul)([^a-z]|$)|triton_tem|"
             r"^product|sm\d\d_"),
    ("LayerNorm", r"layer_?norm|(^|[^a-z])ln_"),
    ("softmax / cross-entropy", r"softmax|cross_entropy|nll_loss|(^|[^a-z])ce_kernel"),
    ("optimizer, clip, loss scaler", r"adam|sgd|multi_tensor|foreach|optim|scaler|unscale|amp_|"
                                     r"non_finite|sum_squares|clip|norm"),
    ("embedding", r"embedding|emb_|index_select|indexselect|gather|scatter|index_put|indexing"),
    ("pooling", r"pool"),
    ("dropout / RNG", r"dropout|philox|bernoulli|rand|uniform|normal_kernel"),
    ("memcpy / memset", r"memcpy|memset|fill|copy"),
    ("elementwise and other fused", r"."),
]
_parts = [(name, re.compile(rx)) for name, rx in PARTS]


def part_of(kernel):
    k = kernel.lower()
    return next(name for name, rx in _parts if rx.search(k))


def read_log(path):
    """{kernel: [calls, total us]} from an ncu, nsys or profile_torch.py CSV."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    # ncu and nsys print their own lines around the CSV: start at its header
    start = next((i for i, line in enumerate(lines)
                  if ("Kernel Name" in line and "Metric Name" in line) or
                  ("Total Time" in line and "Name" in line) or line.startswith("kernel,")), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu, nsys or profile_torch.py CSV header found")
    body = lines[start:]
    if "Metric Name" in body[0]:   # ncu: the program's own output may follow
        body = [line for line in body if line.startswith('"')]
    rows = list(csv.DictReader(body))
    out = defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        if "Metric Name" in row:                       # ncu
            if row.get("Metric Name") != "gpu__time_duration.sum":
                continue
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
                     "ms": 1e3, "second": 1e6, "s": 1e6}[row["Metric Unit"]]
            name, calls = row["Kernel Name"], 1
            us = float(row["Metric Value"].replace(",", "")) * scale
        elif "kernel" in row:                          # profile_torch.py
            name, calls, us = row["kernel"], float(row["calls_per_iter"]), float(row["us_per_iter"])
        else:                                          # nsys cuda_gpu_kern_sum
            total = next(k for k in row if k.startswith("Total Time"))
            name, calls = row["Name"], float(row["Instances"])
            us = float(row[total].replace(",", "")) * (1e-3 if "(ns)" in total else 1.0)
        name = re.sub(r"^void ", "", name.split("(")[0].strip())[:100]
        out[name][0] += calls
        out[name][1] += us
    return out


def per_kernel_table(times, iters):
    all_us = sum(us for _, us in times.values()) or 1.0
    print(f"{'kernel':90s} {'calls/it':>8s} {'us/it':>9s} {'%':>6s}")
    for name, (calls, us) in sorted(times.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:90]:90s} {calls / iters:8.1f} {us / iters:9.1f} {100 * us / all_us:6.2f}")
    print(f"{'total':90s} {sum(c for c, _ in times.values()) / iters:8.1f} {all_us / iters:9.1f}")


def compare(sides, step_ms, top, title):
    """sides: [(label, {kernel: [calls, us]} per iteration)]."""
    parts = []
    for label, times in sides:
        p = defaultdict(float)
        for name, (_, us) in times.items():
            p[part_of(name)] += us / 1e3
        parts.append(p)
    names = sorted({n for p in parts for n in p}, key=lambda n: -max(p.get(n, 0) for p in parts))
    totals = [sum(p.values()) for p in parts]
    if title:
        print(f"### {title}\n")
    print("| part (ms per step) | " + " | ".join(f"{lab} | %" for lab, _ in sides) + " |")
    print("|---|" + "---:|---:|" * len(sides))
    for n in names:
        cells = [f"{p.get(n, 0):.3f} | {100 * p.get(n, 0) / t:.1f}" if t else "- | -"
                 for p, t in zip(parts, totals)]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("| **all kernels** | " + " | ".join(f"**{t:.3f}** | " for t in totals) + " |")
    if step_ms:
        steps = [step_ms.get(lab) for lab, _ in sides]
        print("| outside kernels (launch gaps, host, idle) | " + " | ".join(
            f"{s - t:.3f} | {100 * (s - t) / s:.1f}" if s else "- | -"
            for s, t in zip(steps, totals)) + " |")
        print("| **step (measured)** | " + " | ".join(f"**{s:.3f}** | " if s else "- | "
                                                     for s in steps) + " |")
    for (label, times), t in zip(sides, totals):
        print(f"\n{label}: the {top} largest kernels (ms per step, calls per step)\n")
        print("| kernel | part | calls | ms | % |\n|---|---|---:|---:|---:|")
        for name, (calls, us) in sorted(times.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"| `{name[:80]}` | {part_of(name)} | {calls:g} | {us / 1e3:.3f} | "
                  f"{100 * us / 1e3 / t:.1f} |")


def main():
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        iters = int(sys.argv[2]) if len(sys.argv) > 2 else 1
        per_kernel_table(read_log(sys.argv[1]), iters)
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", action="append", required=True, help="LABEL=FILE[:ITERS]")
    ap.add_argument("--step-ms", action="append", default=[], help="LABEL=MS")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    sides = []
    for s in a.side:
        label, spec = s.split("=", 1)
        path, _, it = spec.rpartition(":") if re.search(r":\d+$", spec) else (spec, "", "1")
        iters = int(it)
        times = {k: [c / iters, us / iters] for k, (c, us) in read_log(path).items()}
        sides.append((label, times))
    step_ms = {}
    for s in a.step_ms:
        label, ms = s.split("=", 1)
        step_ms[label] = float(ms)
    compare(sides, step_ms, a.top, a.title)


if __name__ == "__main__":
    main()
