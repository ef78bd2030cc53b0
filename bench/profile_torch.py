#!/usr/bin/env python3
"""Where a PyTorch training step's GPU time goes, kernel by kernel (torch.profiler), for a
workload and variant of bench_train.py (the same model, batch, dtype and step): the torch
column of bench/profile_step.sh's table.
  python3 bench/profile_torch.py --workload gpt2 --variant compile [--iters 3] [--csv FILE]
Prints the per-kernel table; --csv writes `kernel,calls_per_iter,us_per_iter` (what
profile_kernels.py --side reads). --device cpu --tiny profiles CPU ops instead (a smoke run)."""
import argparse
import csv
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train as bt  # noqa: E402


def kernel_times(prof, cuda):
    """{name: (calls, total us)} of the device kernels, memcpys and memsets (CPU ops on the
    CPU) the profiler saw."""
    out = {}
    for e in prof.key_averages():
        if cuda:
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = e.self_cuda_time_total
        else:
            us = e.self_cpu_time_total
        if us > 0:
            calls, total = out.get(e.key, (0, 0.0))
            out[e.key] = (calls + e.count, total + us)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="gpt2", choices=["gpt-char", "gpt2", "cnn"])
    ap.add_argument("--variant", default="",
                    help="a bench_train.py variant (default: compile, cnn gpu-compile)")
    ap.add_argument("--iters", type=int, default=3, help="profiled steps")
    ap.add_argument("--warm", type=int, default=10, help="steps before the profiled ones")
    ap.add_argument("--csv")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--fashion-dir", default=os.environ.get("NT_FASHION_DIR",
                                                            "/usr/share/datasets/fashion-mnist"))
    a = ap.parse_args()
    # what bench_train's workload helpers read
    a.window, a.skip, a.windows, a.cnn_workers = 0, 1, a.iters + a.warm, 4
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True
    if a.workload == "cnn":
        variant = a.variant or "gpu-compile"
        cfg, _ = bt.cnn_workload(a)
        data = bt.torch_data("cnn", cfg, None, dev, a)
        step, _, end = bt.cnn_stepper(cfg, variant, data, dev, a, {})
    else:
        variant = a.variant or "compile"
        cfg, toks, _ = bt.gpt_workload(a.workload, a)
        data = bt.torch_data(a.workload, cfg, toks, dev, a)
        step, _, end = bt.gpt_stepper(cfg, variant, data, dev, a, {})
    for i in range(a.warm):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(a.iters):
            step(a.warm + i)
        if cuda:
            torch.cuda.synchronize()
    if end:
        end()
    times = sorted(kernel_times(prof, cuda).items(), key=lambda kv: -kv[1][1])
    total = sum(us for _, us in (v for _, v in times))
    print(f"torch {torch.__version__}: {a.workload} {variant}, {a.iters} steps")
    print(f"{'kernel':90s} {'calls/it':>8s} {'us/it':>9s} {'%':>6s}")
    for name, (calls, us) in times:
        print(f"{name[:90]:90s} {calls / a.iters:8.1f} {us / a.iters:9.1f} {100 * us / total:6.2f}")
    print(f"{'total':90s} {sum(c for c, _ in (v for _, v in times)) / a.iters:8.1f} "
          f"{total / a.iters:9.1f}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kernel", "calls_per_iter", "us_per_iter"])
            for name, (calls, us) in times:
                w.writerow([name, calls / a.iters, us / a.iters])


if __name__ == "__main__":
    main()
