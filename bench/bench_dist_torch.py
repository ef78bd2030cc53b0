#!/usr/bin/env python3
"""PyTorch's data parallelism on the GPT-2 124M workload of bench_train.py, one process per GPU,
for the side-by-side with nanotrain's strategies (scripts/gpu_multi.sh, part 2).

Every rank builds bench_train.py's GPT (gpt_config("gpt2"): 12 layers, 12 heads, 768 wide, block
1024, batch 16 per rank, no dropout), seeded alike on every rank, and takes bench_train.py's
step: bf16 autocast, loss, backward, clip to global norm 1.0, fused AdamW (nanoGPT's decay
groups). Its batches (16, drawn with the rank as seed) are in device memory before timing.
  --wrap ddp           torch.nn.parallel.DistributedDataParallel (gradient_as_bucket_view):
                       nanotrain's NO_SHARD
  --wrap fsdp2-full    torch.distributed.fsdp.fully_shard on every transformer block with
                       reshard_after_forward=True, then on the root (embeddings, ln_f; its
                       default: not resharded after forward, as nanotrain keeps the last unit):
                       FULL_SHARD (ZeRO-3)
  --wrap fsdp2-grad-op the same with reshard_after_forward=False everywhere (parameters stay
                       gathered from forward to backward): SHARD_GRAD_OP (ZeRO-2-like)
  --wrap none          no wrapper: each rank trains alone (no communication, an upper bound)
FSDP2 runs with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), what nanotrain's
runtime does in bf16 (it gathers the compute copy, reduces fp32 gradients);
--fsdp-param-dtype fp32 gathers fp32 parameters and leaves the casts to autocast. DDP reduces
the fp32 gradients. --compile: torch.compile around the DDP module (DDP's recommended order),
around each block before fully_shard (FSDP2), around the model (none).
--vocab padded (default) uses 50304 rows, the vocabulary nanotrain and nanoGPT compute with
(padded logits left unmasked, as nanoGPT does); --vocab exact keeps 50257.

Timing, as bench_train.py's: `skip` warm-up windows (compilation happens there), a barrier,
then `windows` windows of `window` steps between CUDA events on the compute stream, read once
at the end; a window's step time = elapsed / window. The ranks' window times are gathered and
each window counts as its slowest rank's; the median over windows is the figure, tokens/s
(global) = world x batch x block / median step time. Peak memory per rank:
torch.cuda.max_memory_allocated over the timed windows (the count restarts after warm-up) less
the pre-built batches, gathered to rank 0.

Launch with torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) or mpirun (Open MPI's
OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, MASTER_ADDR 127.0.0.1 and MASTER_PORT 29500 unless
set); without either it runs as one rank:
  torchrun --standalone --nproc_per_node 8 bench/bench_dist_torch.py --wrap fsdp2-full --json r.json
  mpirun -np 8 -x MASTER_PORT=29511 python3 bench/bench_dist_torch.py --wrap ddp
  torchrun --standalone --nproc_per_node 2 bench/bench_dist_torch.py --device cpu --tiny --wrap ddp
--device cpu: the gloo backend, no peak memory (smoke runs: they check the script, not speed);
--tiny: bench_train.py's tiny GPT-2 shapes. A wrapper this torch cannot run on the CPU exits 77
(skipped) with the reason. Rank 0 prints one line and writes --json.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import GPT, Clock, adamw, gpt_batches, gpt_config, gpt_step, padded, time_windows  # noqa: E402

WRAPS = ("ddp", "fsdp2-full", "fsdp2-grad-op", "none")
SKIP = 77   # ctest's SKIP_RETURN_CODE in this project


def launcher_env():
    """RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE from torchrun, Open MPI or neither
    (one rank); MASTER_ADDR / MASTER_PORT defaulted for env:// rendezvous. Returns the
    launcher's name."""
    e = os.environ
    if "RANK" in e and "WORLD_SIZE" in e:
        who = "torchrun" if "TORCHELASTIC_RUN_ID" in e else "env"
    elif "OMPI_COMM_WORLD_RANK" in e:
        who = "mpirun"
        e["RANK"] = e["OMPI_COMM_WORLD_RANK"]
        e["WORLD_SIZE"] = e["OMPI_COMM_WORLD_SIZE"]
        e["LOCAL_RANK"] = e.get("OMPI_COMM_WORLD_LOCAL_RANK", e["RANK"])
        e["LOCAL_WORLD_SIZE"] = e.get("OMPI_COMM_WORLD_LOCAL_SIZE", e["WORLD_SIZE"])
        e.setdefault("MASTER_PORT", "29500")
    else:
        who = "single"
        e.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        if "MASTER_PORT" not in e:   # any free port: nobody else joins
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                e["MASTER_PORT"] = str(s.getsockname()[1])
    e.setdefault("LOCAL_RANK", e["RANK"])
    e.setdefault("LOCAL_WORLD_SIZE", e["WORLD_SIZE"])
    e.setdefault("MASTER_ADDR", "127.0.0.1")
    return who


def wrap_model(model, a, world, dev):
    """The model wrapped as --wrap says; returns (the module whose parameters the optimizer
    and the clip take, the callable of the forward)."""
    if a.wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                  gradient_as_bucket_view=True)
        return model, torch.compile(ddp) if a.compile else ddp
    if a.wrap == "none":
        return model, torch.compile(model) if a.compile else model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(dev.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if a.fsdp_param_dtype == "bf16" else None,
                              reduce_dtype=torch.float32)
    full = a.wrap == "fsdp2-full"
    for i in range(len(model.h)):
        if a.compile:   # the FSDP hooks stay outside the compiled block
            model.h[i] = torch.compile(model.h[i])
        fully_shard(model.h[i], mesh=mesh, reshard_after_forward=full, mp_policy=mp)
    # the root: None lets FSDP2 keep it gathered after forward (its backward starts at once)
    fully_shard(model, mesh=mesh, reshard_after_forward=None if full else False, mp_policy=mp)
    return model, model


def git_commit():
    r = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    return r.stdout.strip() or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wrap", default="ddp", choices=WRAPS)
    ap.add_argument("--compile", action="store_true", help="torch.compile (see above)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--batch-size", type=int, default=0, help="per rank (default 16; tiny 2)")
    ap.add_argument("--vocab", default="padded", choices=["padded", "exact"])
    ap.add_argument("--fsdp-param-dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--windows", type=int, default=7, help="timed windows (>= 5)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up windows")
    ap.add_argument("--window", type=int, default=0, help="steps per window (default 20)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds a collective may wait before the process group gives up")
    ap.add_argument("--json", help="rank 0 writes the result here")
    a = ap.parse_args()
    if a.windows < 5 and not a.tiny:
        ap.error("--windows must be >= 5 (medians of at least 5 windows)")
    who = launcher_env()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    tag = f"bench_dist_torch rank {rank}/{world}"

    if a.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("no CUDA device visible to torch (use --device cpu --tiny for a smoke run)")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        backend = "nccl"
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        dev = torch.device("cpu")
        backend = "gloo"
        # the ranks of one host share its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
    kw = {"device_id": dev} if dev.type == "cuda" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=a.timeout), **kw)

    cfg = gpt_config("gpt2", a.tiny)
    B = a.batch_size or cfg["B"]
    T, window = cfg["T"], a.window or cfg["window"]
    V = padded(cfg["V"]) if a.vocab == "padded" else cfg["V"]
    # the batches first (their memory is left out of the peak), drawn per rank
    toks = torch.randint(cfg["V"], (4_000_000,), generator=torch.Generator().manual_seed(0))
    batches = gpt_batches(toks, B, T, 16, dev, seed=rank)
    del toks
    clock = Clock(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()

    torch.manual_seed(0)   # the same initial model on every rank
    model = GPT(cfg["L"], cfg["H"], cfg["C"], T, V, cfg["p"]).to(dev)
    try:
        model, fwd = wrap_model(model, a, world, dev)
    except Exception as e:
        if dev.type == "cpu" and a.wrap.startswith("fsdp2"):
            print(f"{tag}: {a.wrap} on the CPU (gloo) is not supported by torch "
                  f"{torch.__version__}: {type(e).__name__}: {e}; skipped", flush=True)
            sys.exit(SKIP)
        raise
    opt = adamw(model, 1e-3, (0.9, 0.99), 0.1)
    # autocast's cache of weight casts off for compiled code, as bench_train.py runs it
    cache = not a.compile

    def step(i):
        return gpt_step(model, fwd, opt, *batches[i % len(batches)], cache=cache)

    t0 = time.time()
    try:
        for i in range(a.skip * window):
            step(i)
        clock.sync()
    except Exception as e:
        if dev.type == "cpu" and a.wrap.startswith("fsdp2"):
            print(f"{tag}: {a.wrap} on the CPU (gloo) failed in its first steps with torch "
                  f"{torch.__version__}: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}; "
                  "skipped", flush=True)
            sys.exit(SKIP)
        raise
    warm_s = time.time() - t0
    dist.barrier()   # the ranks start the timed windows together
    r = time_windows(step, clock, 0, a.windows, window, B * T)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if dev.type == "cuda" else None

    mine = {"windows_ms": r["windows_ms"], "peak_mib": peak, "loss": r["loss"],
            "host": socket.gethostname(), "device": str(dev)}
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        slowest = [max(x["windows_ms"][k] for x in every) for k in range(a.windows)]
        med = statistics.median(slowest)
        res = {
            "wrap": a.wrap, "compile": a.compile, "world_size": world, "launcher": who,
            "backend": backend, "device": a.device,
            "tokens_per_s": world * B * T / med * 1e3,
            "step_ms_median": med, "step_ms_min": min(slowest), "step_ms_max": max(slowest),
            "windows_ms": slowest, "rank_windows_ms": [x["windows_ms"] for x in every],
            "peak_mib": [x["peak_mib"] for x in every], "loss": [x["loss"] for x in every],
            "warmup_s": warm_s,
            "config": {"n_layer": cfg["L"], "n_head": cfg["H"], "n_embd": cfg["C"],
                       "block_size": T, "vocab": V, "batch_per_rank": B, "dtype": "bf16 autocast",
                       "fsdp_param_dtype": a.fsdp_param_dtype if a.wrap.startswith("fsdp2") else None,
                       "skip": a.skip, "windows": a.windows, "window": window, "tiny": a.tiny},
            "torch": torch.__version__, "commit": git_commit(),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        mem = " ".join(f"r{k} " + ("-" if p is None else f"{p:.0f}")
                       for k, p in enumerate(res["peak_mib"]))
        print(f"torch {a.wrap}{' compile' if a.compile else ''}, {world} rank"
              f"{'s' if world > 1 else ''} ({backend}): {res['tokens_per_s']:,.0f} tokens/s, "
              f"step {med:.3f} ms (min {min(slowest):.3f}, max {max(slowest):.3f}), "
              f"peak MiB {mem}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)   # a failed rank must not wait in a collective for the others
