#!/usr/bin/env python3
"""torch's equivalents of bench_memops' cases, on the same shapes and dtype in the same run,
and a side-by-side table.

    bench_memops.py NT_OUTPUT [--dtype bf16|f16|f32] [--repeats 20]

NT_OUTPUT holds bench_memops' lines ("RESULT name rows cols dtype bytes us GBps"). torch runs:
  copy      dst.copy_(src) (2 GiB)
  ln_fwd    aten.native_layer_norm(x, [C], w, b, 1e-5)       (F.layer_norm's kernel)
  ln_bwd    aten.native_layer_norm_backward(dy, x, [C], mean, rstd, w, b, [True]*3)
  gelu_fwd  F.gelu(x, approximate='tanh')
  gelu_bwd  aten.gelu_backward(dy, x, approximate='tanh')
  ce_fused  torch.autograd.grad(F.cross_entropy(logits, targets), logits)  (forward + backward)
timed like bench_memops (warm-up, batches >= 2 ms between CUDA events, median per call, rotation
over copies when one call's data fits in 4x a 60 MB L2 bound). GB/s uses nanotrain's byte count
for both (the bytes the op must move), so the GB/s ratio is the speed ratio.
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

L2_BOUND = 60.0 * 1024 * 1024
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def parse(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 8 and p[0] == "RESULT":
                rows.append(dict(name=p[1], rows=int(p[2]), cols=int(p[3]), dtype=p[4],
                                 bytes=float(p[5]), us=float(p[6]), gbps=float(p[7])))
    return rows


def make_call(r, dtype, rot):
    R, C = r["rows"], r["cols"]
    name = r["name"]
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *s, scale=1.0: (torch.rand(*s, device="cuda", generator=g) * scale).to(dtype)
    if name == "copy":
        src = torch.rand(C // 4, device="cuda")
        dst = torch.empty_like(src)
        return lambda k: dst.copy_(src)
    if name in ("ln_fwd", "ln_bwd"):
        w, b = rnd(C, scale=1.5), rnd(C)
        xs = [rnd(R, C, scale=4.0) for _ in range(rot)]
        if name == "ln_fwd":
            return lambda k: torch.ops.aten.native_layer_norm(xs[k], [C], w, b, 1e-5)
        stats = [torch.ops.aten.native_layer_norm(x, [C], w, b, 1e-5) for x in xs]
        dys = [rnd(R, C) for _ in range(rot)]
        return lambda k: torch.ops.aten.native_layer_norm_backward(
            dys[k], xs[k], [C], stats[k][1], stats[k][2], w, b, [True, True, True])
    if name in ("gelu_fwd", "gelu_bwd"):
        xs = [rnd(R, C, scale=4.0) for _ in range(rot)]
        if name == "gelu_fwd":
            return lambda k: F.gelu(xs[k], approximate="tanh")
        dys = [rnd(R, C) for _ in range(rot)]
        return lambda k: torch.ops.aten.gelu_backward(dys[k], xs[k], approximate="tanh")
    if name == "ce_fused":
        xs = [rnd(R, C, scale=4.0).requires_grad_(True) for _ in range(rot)]
        ts = [(torch.arange(R, device="cuda") * 7919 + k) % C for k in range(rot)]
        return lambda k: torch.autograd.grad(F.cross_entropy(xs[k], ts[k]), xs[k])
    raise ValueError(name)


def time_call(call, rot, repeats):
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
    return 1000.0 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nt_output")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    rows = parse(a.nt_output)
    if not rows:
        sys.exit("bench_memops.py: no RESULT lines in " + a.nt_output)
    dtype = DTYPES[a.dtype]
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, dtype {a.dtype}")
    nt_copy = next((r["gbps"] for r in rows if r["name"] == "copy"), None)
    th_copy = None
    out = []
    for r in rows:
        rot = 1 if r["name"] == "copy" else max(1, min(16, int(-(-4 * L2_BOUND // r["bytes"]))))
        us = time_call(make_call(r, dtype, rot), rot, a.repeats)
        gbps = r["bytes"] / (us * 1e-6) / 1e9
        if r["name"] == "copy":
            th_copy = gbps
        out.append((r, us, gbps))
        torch.cuda.empty_cache()
    print()
    print("| op | rows x cols | nanotrain us | nanotrain GB/s | % of copy | torch us | torch GB/s "
          "| torch % of copy | nanotrain speed vs torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r, us, gbps in out:
        pc = 100.0 * r["gbps"] / nt_copy if nt_copy else 0.0
        tpc = 100.0 * gbps / th_copy if th_copy else 0.0
        print(f"| {r['name']} | {r['rows']} x {r['cols']} | {r['us']:.1f} | {r['gbps']:.0f} | "
              f"{pc:.0f}% | {us:.1f} | {gbps:.0f} | {tpc:.0f}% | {us / r['us']:.2f}x |")
    bad = [r["name"] + f" {r['rows']}x{r['cols']}" for r, _, _ in out
           if r["name"] != "copy" and r["bytes"] >= 256e6 and nt_copy and r["gbps"] < 0.7 * nt_copy]
    print()
    print("target (>= 70% of copy bandwidth for cases moving >= 256 MB): " +
          ("met" if not bad else "NOT met for " + ", ".join(bad)))


if __name__ == "__main__":
    main()
