#!/usr/bin/env python3
"""nt_gemm (bench_gemm) and torch.matmul on the same shapes, interleaved, and a side-by-side table.

    bench_gemm.py BENCH_GEMM_BINARY [--dtype bf16|f16] [--repeats 20] [--rounds 2]
                  [--shapes all|small|gpt2|square|NAME] [--no-graph] [--torch-lt]

Both sides are measured the same way. For each shape and round, bench_gemm runs that shape
alone (a fresh process: warm-up, autotuning, a batch of `inner` calls rotating over `rot`
input copies, replayed as one CUDA graph `repeats` times between CUDA events, median per
call), then torch runs the same shape right away with bench_gemm's inner, rot and repeats:
random normal inputs, the same transposes (views, as nanotrain passes them), out= into
preallocated outputs, the same warm-up, the same call sequence (call i uses copy i % rot)
captured as one CUDA graph (so Python's per-call overhead is not measured, as the C side's is
not). Rounds alternate nt, torch, nt, torch...; each side's figure is its best round median,
so clock and thermal drift between rounds treat both alike. torch runs with its default matmul
settings (printed); --torch-lt makes torch prefer cuBLASLt (its own heuristic's first choice).
The bar: nanotrain >= 0.95x torch on every shape.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys

import torch


def parse_result(text):
    for line in text.splitlines():
        p = line.split()
        if len(p) == 12 and p[0] == "RESULT":
            return dict(name=p[1], M=int(p[2]), N=int(p[3]), K=int(p[4]), ta=p[5] == "1",
                        tb=p[6] == "1", ms=float(p[7]), tflops=float(p[8]), inner=int(p[9]),
                        rot=int(p[10]), graph=p[11] == "1")
    return None


def run_nt(binary, name, dtype, repeats, graph):
    cmd = [binary, "--dtype", dtype, "--repeats", str(repeats), "--shapes", name]
    if not graph:
        cmd.append("--no-graph")
    # cuBLAS logging variables are meant for torch here (run_gemm.sh diag logs nanotrain in a
    # run of its own): the child runs without them.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUBLASLT_LOG", "CUBLAS_LOG"))}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stderr.write(out.stderr)
    r = parse_result(out.stdout)
    if out.returncode != 0 or r is None:
        sys.exit(f"bench_gemm.py: {' '.join(cmd)} failed (rc {out.returncode}):\n{out.stdout}")
    return r


def time_torch(r, dtype, repeats, graph):
    M, N, K, rot, inner = r["M"], r["N"], r["K"], r["rot"], r["inner"]
    torch.manual_seed(0)
    a = [torch.randn((K, M) if r["ta"] else (M, K), device="cuda", dtype=dtype) for _ in range(rot)]
    b = [torch.randn((N, K) if r["tb"] else (K, N), device="cuda", dtype=dtype) for _ in range(rot)]
    a = [x.t() if r["ta"] else x for x in a]
    b = [x.t() if r["tb"] else x for x in b]
    d = [torch.empty((M, N), device="cuda", dtype=dtype) for _ in range(rot)]

    def batch():
        for i in range(inner):
            k = i % rot
            torch.matmul(a[k], b[k], out=d[k])

    # The same warm-up as bench_gemm: 3 calls, then 5 (its calibration run).
    for i in range(8):
        torch.matmul(a[i % rot], b[i % rot], out=d[i % rot])
    torch.cuda.synchronize()
    run = batch
    used_graph = False
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                torch.matmul(a[0], b[0], out=d[0])  # cuBLAS handle/workspace for this stream
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                batch()
            run = g.replay
            used_graph = True
        except Exception as e:  # noqa: BLE001 - report and time eagerly
            print(f"bench_gemm.py: torch graph capture failed ({e}); timing eagerly",
                  file=sys.stderr)
            torch.cuda.synchronize()
    run()  # upload / warm, as bench_gemm does
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    del a, b, d
    if used_graph:
        del g
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # leave the memory to the next bench_gemm process
    return statistics.median(times), used_graph


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", help="path of bench_gemm")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--torch-lt", action="store_true", help="torch prefers cuBLASLt")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    graph = not args.no_graph
    if args.torch_lt:
        torch.backends.cuda.preferred_blas_library("cublaslt")
    names = subprocess.run([args.binary, "--list", "--shapes", args.shapes], capture_output=True,
                           text=True, check=True).stdout.split()
    if not names:
        sys.exit(f"bench_gemm.py: no shapes for --shapes {args.shapes}")
    # Interleaving needs two processes on the GPU at once (torch idle while bench_gemm runs);
    # a GPU in an exclusive compute mode allows one: then every nanotrain run comes first,
    # before torch touches the GPU (said in the header).
    try:
        cmode = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout.split("\n")[0].strip()
    except OSError:
        cmode = "?"
    sequential = cmode.lower().startswith("exclusive")
    rounds = max(1, args.rounds)
    nt_runs = {}
    if sequential:
        for name in names:
            nt_runs[name] = [run_nt(args.binary, name, args.dtype, args.repeats, graph)
                             for _ in range(rounds)]
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.split("\n")[0].strip()
    except OSError:
        driver = "?"
    red = (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction if dtype == torch.bfloat16
           else torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
    try:
        blas = str(torch.backends.cuda.preferred_blas_library())
    except Exception:  # noqa: BLE001 - older torch
        blas = "?"
    print(f"GEMM {args.dtype}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{props.name}, driver {driver}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
          f"blas {blas}, reduced-precision reduction {red}), median of {args.repeats} repeats, "
          f"best of {rounds} {'sequential (GPU compute mode ' + cmode + ')' if sequential else 'interleaved'} "
          f"rounds, CUDA graphs {'on' if graph else 'off'}")
    print()
    print("| shape | M | N | K | op | nanotrain TFLOP/s | torch TFLOP/s | ratio | inner | rot | |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    worst = None
    for name in names:
        nt_ms, th_ms, r, graphs = [], [], None, set()
        for i in range(rounds):
            r = nt_runs[name][i] if sequential else run_nt(args.binary, name, args.dtype,
                                                           args.repeats, graph)
            nt_ms.append(r["ms"])
            ms, g = time_torch(r, dtype, args.repeats, graph)
            th_ms.append(ms)
            graphs.add((r["graph"], g))
        flops = 2.0 * r["M"] * r["N"] * r["K"]
        nt_tf = flops / (min(nt_ms) * 1e-3) / 1e12
        th_tf = flops / (min(th_ms) * 1e-3) / 1e12
        ratio = nt_tf / th_tf if th_tf > 0 else float("nan")
        worst = ratio if worst is None else min(worst, ratio)
        op = ("T" if r["ta"] else "N") + ("T" if r["tb"] else "N")
        flag = "ok" if ratio >= 0.95 else "BELOW 0.95"
        if any(a != b for a, b in graphs):
            flag += " (graph on one side only: not comparable)"
        print(f"| {name} | {r['M']} | {r['N']} | {r['K']} | {op} | {nt_tf:.1f} | {th_tf:.1f} | "
              f"{ratio:.3f} | {r['inner']} | {r['rot']} | {flag} |", flush=True)
    print()
    print(f"worst ratio {worst:.3f}: bar (>= 0.95 on every shape) "
          f"{'met' if worst >= 0.95 else 'NOT met'}")


if __name__ == "__main__":
    main()
