#!/usr/bin/env python3
"""torch.matmul at the shapes bench_gemm measured, in the same run, and a side-by-side table.

    bench_gemm.py NT_OUTPUT [--dtype bf16|f16] [--repeats 20]

NT_OUTPUT holds bench_gemm's lines ("RESULT name M N K ta tb ms tflops"). Each shape is timed
the way bench_gemm times it: random normal inputs, the same transposes (views, as nanotrain
passes them), warm-up, repeats of a batch of calls lasting >= 2 ms between CUDA events, median
per call, and rotation over input copies when A + B + D fit in 4x the L2 cache. torch runs with
its default matmul settings (printed). The bar: nanotrain >= 0.95x torch on every shape.
"""
import argparse
import datetime
import statistics
import subprocess
import sys

import torch


def parse(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 9 and p[0] == "RESULT":
                rows.append(dict(name=p[1], M=int(p[2]), N=int(p[3]), K=int(p[4]),
                                 ta=p[5] == "1", tb=p[6] == "1", ms=float(p[7]),
                                 tflops=float(p[8])))
    return rows


def time_torch(r, dtype, repeats, l2):
    M, N, K = r["M"], r["N"], r["K"]
    es = torch.tensor([], dtype=dtype).element_size()
    work = (M * K + K * N + M * N) * es
    rot = min(16, -(-4 * l2 // work)) if work < 4 * l2 else 1
    torch.manual_seed(0)
    a = [torch.randn((K, M) if r["ta"] else (M, K), device="cuda", dtype=dtype) for _ in range(rot)]
    b = [torch.randn((N, K) if r["tb"] else (K, N), device="cuda", dtype=dtype) for _ in range(rot)]
    a = [x.t() if r["ta"] else x for x in a]
    b = [x.t() if r["tb"] else x for x in b]
    d = [torch.empty((M, N), device="cuda", dtype=dtype) for _ in range(rot)]
    call = lambda k: torch.matmul(a[k], b[k], out=d[k])
    for i in range(3):
        call(i % rot)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(5):
        call(i % rot)
    e1.record()
    e1.synchronize()
    ms = e0.elapsed_time(e1)
    inner = min(2000, int(2.0 / (ms / 5)) + 1) if ms > 0 else 1
    times = []
    for rep in range(repeats):
        e0.record()
        for i in range(inner):
            call((rep * inner + i) % rot)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    del a, b, d
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nt_output")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    rows = parse(args.nt_output)
    if not rows:
        sys.exit("bench_gemm.py: no RESULT lines in " + args.nt_output)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.split("\n")[0].strip()
    except OSError:
        driver = "?"
    red = (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction if dtype == torch.bfloat16
           else torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
    print(f"GEMM {args.dtype}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {props.name}, "
          f"driver {driver}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
          f"reduced-precision reduction {red}), median of {args.repeats} repeats")
    print()
    print("| shape | M | N | K | op | nanotrain TFLOP/s | torch TFLOP/s | ratio | |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---|")
    worst = None
    for r in rows:
        ms = time_torch(r, dtype, args.repeats, l2)
        tt = 2.0 * r["M"] * r["N"] * r["K"] / (ms * 1e-3) / 1e12
        ratio = r["tflops"] / tt if tt > 0 else float("nan")
        worst = ratio if worst is None else min(worst, ratio)
        op = ("T" if r["ta"] else "N") + ("T" if r["tb"] else "N")
        flag = "ok" if ratio >= 0.95 else "BELOW 0.95"
        print(f"| {r['name']} | {r['M']} | {r['N']} | {r['K']} | {op} | {r['tflops']:.1f} | "
              f"{tt:.1f} | {ratio:.3f} | {flag} |", flush=True)
    print()
    print(f"worst ratio {worst:.3f}: bar (>= 0.95 on every shape) "
          f"{'met' if worst >= 0.95 else 'NOT met'}")


if __name__ == "__main__":
    main()
