#!/usr/bin/env python3
"""nt_gemm (bench_gemm) and torch.matmul on the same shapes, interleaved, and a side-by-side table.

    bench_gemm.py BENCH_GEMM_BINARY [--dtype bf16|f16] [--repeats 20] [--rounds 4]
                  [--shapes all|small|gpt2|square|NAME[,NAME...]] [--no-graph] [--torch-lt]
                  [--search-modes 0,1[,2]] [--nt-log DIR]
    bench_gemm.py --summarize-logs DIR

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

--search-modes runs nanotrain once per NT_GEMM_SEARCH mode in every round (0: the heuristic's
top 32 only; 1: the default widened search for shapes >= 1 GFLOP; 2: exhaustive) and prints
one column per mode, each mode's ratio to torch, and the one-time tuning cost of the last mode
(seconds of the shape's first call, from bench_gemm's TUNE line). --nt-log DIR runs nanotrain
with NT_LOG=debug and keeps each run's log as DIR/<shape>.s<mode>.r<round>.log;
--summarize-logs DIR then prints each log's search summary, fastest configurations and kept
plan, with tile, stages and cluster ids spelled out from cublasLt.h's enums.
"""
import argparse
import datetime
import glob
import os
import re
import statistics
import subprocess
import sys

try:
    import torch
except ImportError:  # --summarize-logs needs no torch
    torch = None


def parse_result(text):
    for line in text.splitlines():
        p = line.split()
        if len(p) == 12 and p[0] == "RESULT":
            return dict(name=p[1], M=int(p[2]), N=int(p[3]), K=int(p[4]), ta=p[5] == "1",
                        tb=p[6] == "1", ms=float(p[7]), tflops=float(p[8]), inner=int(p[9]),
                        rot=int(p[10]), graph=p[11] == "1")
    return None


def cublaslt_enums():
    """Tile, stages and cluster-shape names by id, from the first cublasLt.h found."""
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    roots += glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "*"))
    names = {"tile": {}, "stages": {}, "cluster": {}}
    for root in roots:
        h = os.path.join(root, "include", "cublasLt.h")
        if not root or not os.path.exists(h):
            continue
        text = open(h).read()
        for key, prefix in (("tile", "CUBLASLT_MATMUL_TILE_"), ("stages", "CUBLASLT_MATMUL_STAGES_"),
                            ("cluster", "CUBLASLT_CLUSTER_SHAPE_")):
            for name, val in re.findall(prefix + r"(\w+)\s*=\s*(\d+)", text):
                names[key].setdefault(int(val), name)
        break
    return names


def summarize_logs(directory):
    names = cublaslt_enums()

    def decode(line):
        for key in ("tile", "stages", "cluster"):
            line = re.sub(rf"\b{key} (\d+)",
                          lambda m: f"{key} {names[key].get(int(m.group(1)), m.group(1))}", line)
        return line

    keep = ("gemm search", "gemm plan", "gemm autotune")
    for path in sorted(glob.glob(os.path.join(directory, "*.log"))):
        print(f"== {os.path.basename(path)}")
        for line in open(path, errors="replace"):
            if any(k in line for k in keep):
                print("  " + decode(re.sub(r" \[cuBLASLt m .*", "", line.rstrip())))
    if not any(names.values()):
        print("(cublasLt.h not found: tile/stages/cluster ids left as numbers)")


def parse_tune(text):
    """bench_gemm's TUNE line: 'TUNE key value key value ...' -> dict of floats."""
    for line in text.splitlines():
        p = line.split()
        if p and p[0] == "TUNE" and len(p) % 2 == 1:
            return {p[i]: float(p[i + 1]) for i in range(1, len(p), 2)}
    return {}


def run_nt(binary, name, dtype, repeats, graph, search=None, log=None):
    cmd = [binary, "--dtype", dtype, "--repeats", str(repeats), "--shapes", name]
    if not graph:
        cmd.append("--no-graph")
    # cuBLAS logging variables are meant for torch here (run_gemm.sh diag logs nanotrain in a
    # run of its own): the child runs without them.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUBLASLT_LOG", "CUBLAS_LOG"))}
    if search is not None:
        env["NT_GEMM_SEARCH"] = str(search)
    if log:
        env["NT_LOG"] = "debug"
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if log:
        with open(log, "w") as f:
            f.write(out.stderr)
    else:
        sys.stderr.write(out.stderr)
    r = parse_result(out.stdout)
    if out.returncode != 0 or r is None:
        sys.exit(f"bench_gemm.py: {' '.join(cmd)} failed (rc {out.returncode}):\n{out.stdout}")
    r["tune"] = parse_tune(out.stdout)
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
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize-logs":
        summarize_logs(sys.argv[2])
        return
    if torch is None:
        sys.exit("bench_gemm.py: timing torch.matmul needs torch")
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", help="path of bench_gemm")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--torch-lt", action="store_true", help="torch prefers cuBLASLt")
    ap.add_argument("--search-modes", default="",
                    help="comma-separated NT_GEMM_SEARCH modes, one nanotrain column each")
    ap.add_argument("--nt-log", default="", help="directory for nanotrain's NT_LOG=debug logs")
    args = ap.parse_args()
    modes = [int(m) for m in args.search_modes.split(",") if m.strip()] or [None]
    if args.nt_log:
        os.makedirs(args.nt_log, exist_ok=True)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    graph = not args.no_graph
    if args.torch_lt:
        torch.backends.cuda.preferred_blas_library("cublaslt")
    names = []
    for item in args.shapes.split(","):
        for n in subprocess.run([args.binary, "--list", "--shapes", item], capture_output=True,
                                text=True, check=True).stdout.split():
            if n not in names:
                names.append(n)
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

    def nt(name, mode, rnd):
        log = (os.path.join(args.nt_log, f"{name}.s{'d' if mode is None else mode}.r{rnd}.log")
               if args.nt_log else None)
        return run_nt(args.binary, name, args.dtype, args.repeats, graph, mode, log)

    nt_runs = {}
    if sequential:
        for name in names:
            for mode in modes:
                nt_runs[name, mode] = [nt(name, mode, i) for i in range(rounds)]
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
    if modes == [None]:
        cols = "nanotrain TFLOP/s | torch TFLOP/s | ratio"
        aligns = "---:|---:|---:"
    else:
        cols = (" | ".join(f"nt S={m} TFLOP/s" for m in modes) + " | torch TFLOP/s | " +
                " | ".join(f"S={m}/torch" for m in modes) + f" | tune s (S={modes[-1]}) | won")
        aligns = "|".join(["---:"] * (2 * len(modes) + 3))
    print(f"| shape | M | N | K | op | {cols} | inner | rot | |")
    print(f"|---|---:|---:|---:|---|{aligns}|---:|---:|---|")
    worst = {m: None for m in modes}
    for name in names:
        nt_ms = {m: [] for m in modes}
        th_ms, r, graphs, tune = [], None, set(), {}
        for i in range(rounds):
            for m in modes:
                r = nt_runs[name, m][i] if sequential else nt(name, m, i)
                nt_ms[m].append(r["ms"])
                graphs.add(r["graph"])
                if m == modes[-1] and i == 0:
                    tune = r["tune"]
            ms, g = time_torch(r, dtype, args.repeats, graph)
            th_ms.append(ms)
            graphs.add(g)
        flops = 2.0 * r["M"] * r["N"] * r["K"]
        th_tf = flops / (min(th_ms) * 1e-3) / 1e12
        nt_tf = {m: flops / (min(nt_ms[m]) * 1e-3) / 1e12 for m in modes}
        ratio = {m: (nt_tf[m] / th_tf if th_tf > 0 else float("nan")) for m in modes}
        for m in modes:
            worst[m] = ratio[m] if worst[m] is None else min(worst[m], ratio[m])
        op = ("T" if r["ta"] else "N") + ("T" if r["tb"] else "N")
        last = modes[-1]
        flag = "ok" if ratio[last] >= 0.95 else "BELOW 0.95"
        if len(graphs) > 1:
            flag += " (graph on one side only: not comparable)"
        if modes == [None]:
            vals = f"{nt_tf[None]:.1f} | {th_tf:.1f} | {ratio[None]:.3f}"
        else:
            vals = (" | ".join(f"{nt_tf[m]:.1f}" for m in modes) + f" | {th_tf:.1f} | " +
                    " | ".join(f"{ratio[m]:.3f}" for m in modes) +
                    f" | {tune.get('tune_s', float('nan')):.2f} | {int(tune.get('won', 0))}")
        print(f"| {name} | {r['M']} | {r['N']} | {r['K']} | {op} | {vals} | {r['inner']} | "
              f"{r['rot']} | {flag} |", flush=True)
    print()
    for m in modes:
        label = "" if m is None else f"NT_GEMM_SEARCH={m}: "
        print(f"{label}worst ratio {worst[m]:.3f}: bar (>= 0.95 on every shape) "
              f"{'met' if worst[m] >= 0.95 else 'NOT met'}")


if __name__ == "__main__":
    main()
