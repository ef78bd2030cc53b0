#!/usr/bin/env python3
"""Training speed and memory: nanotrain against PyTorch's variants, same GPU, same run.

Workloads (the same model, config, dtype and batch on both sides):
  gpt-char  nanoGPT shakespeare_char: 6 layers, 6 heads, 384 wide, block 256, batch 64,
            dropout 0.2, bf16
  gpt2      GPT-2 124M: 12/12/768, block 1024, vocabulary 50257, batch 16, dropout 0, bf16
  cnn       the Fashion-MNIST CNN of models/cnn.c (conv3x3 32-32, pool, 64-64, pool,
            fc 3136-256-10), batch 256, fp16 with a dynamic loss scaler
Every step on both sides: forward, loss, backward, clip to global norm 1.0, fused AdamW.

PyTorch variants (default: those marked *; --variants picks others; a variant that fails is
reported and the rest go on):
  gpt*  eager *        the model as written, SDPA attention, fused AdamW
        compile *      torch.compile(model) (default mode)
        compile-pad    torch.compile with the vocabulary padded to a multiple of 64 (50304 for
                       GPT-2, as nanoGPT and nanotrain pad; padded logits are left unmasked, as
                       nanoGPT does); only where padding changes the vocabulary (* for gpt2)
        graph-eager    the whole step - forward, backward, clip, capturable fused AdamW - in
                       one torch.cuda.graph, replayed each step; the padded vocabulary where it
                       applies (* for gpt-char, where launch overhead matters)
        graph-compile *  the same around the compiled model
  cnn   dataloader *   DataLoader (4 workers as nanotrain's loader, pinned memory, persistent
                       workers, non-blocking copies), NCHW, eager, GradScaler, fused AdamW
        gpu-eager *    the dataset in GPU memory (a gather per step), channels_last, eager
        gpu-compile *  the same with torch.compile
        graph-eager *  the whole step (forward, backward, GradScaler unscale/step/update,
                       clip, capturable fused AdamW) in one torch.cuda.graph; data on the GPU
        graph-compile *  the same around the compiled model: the strongest setup
  cudnn.benchmark is on for every CNN variant.

How each side is timed (the same way):
  PyTorch: after `warm-up` steps (compilation, cuDNN autotuning and graph capture happen there)
    and a synchronisation, a CUDA event is recorded on the compute stream, then after every
    `window` steps; nothing synchronises in between (no .item(), no per-step sync). The events
    are read after the last window. Step time of a window = elapsed / window steps. The GPT's
    batches are built in GPU memory before timing (random windows of the token stream, as
    nanoGPT's get_batch draws them) and cycled; the CNN's dataset lives in GPU memory
    (gpu-*/graph-* variants: one gather per step into the step's input) or comes through the
    DataLoader (dataloader variant: its host work is part of the step, as in real training).
    The graph variants copy each batch into the graph's static inputs (device to device)
    before each replay; that copy is timed. The learning rate is a constant on this side
    (nanotrain computes its warmup/cosine schedule each step, on its side of the ledger).
  nanotrain: build/nanotrain runs as a subprocess with --log-interval = window and
    --max-iters = (skip + windows) * window, and writes metrics.jsonl. Its trainer times each
    log window on the GPU (CUDA events on the compute stream at the window's ends, read when
    the log syncs; trainers older than that change report the host time between the log's
    syncs, which is the same span) and reports `step_ms` = window time / window steps. The
    first `skip` windows are warm-up (graph capture, GEMM tuning) and are dropped, as are
    windows that contain an evaluation and partial windows. Each window starts right after the
    log's sync, so the launch of its first step is counted against nanotrain (torch's windows
    run back to back). Its batches come from its own loader (GPT: random windows drawn on the
    host each step; CNN: the async pinned-memory loader).
  llm.c (--llmc BIN, GPT-2 only; bench/build_llmc.sh builds it from a checkout): its
    train_gpt2cu on the same token stream (written as its shards), -r 0 (the GELU output kept,
    as ours), with and without its GELU epilogue fusions (-ge 2 / 0). It times every step
    with CUDA events and synchronises after each (its loop reads the loss and the gradient
    norm on the host): those step times, averaged over windows of `window` steps.
  Both: the median over the >= 5 windows is the figure; the spread is the windows' min-max.
  items/s = items per step / median step time. Peak memory: torch.cuda.max_memory_allocated
  over the timed windows (the count restarts after the warm-up; for the graph variants it
  covers the warm-up and capture too, time_windows says why), less the memory that holds
  the data set / pre-built batches (nanotrain keeps neither on the GPU); nanotrain: its pool's
  peak allocated bytes over the whole run, warm-up included.

  python3 bench/bench_train.py --train build/nanotrain [--only gpt-char,gpt2,cnn]
      [--variants eager,compile,...] [--windows 7] [--skip 2] [--json FILE] [--log-dir DIR]
  python3 bench/bench_train.py --device cpu --tiny ...   (a CPU smoke run of every code path
      but the CUDA graphs, with tiny shapes: it checks the script, not speed)
Prints a markdown table; --json FILE writes every window's figures.
"""
import argparse
import gc
import gzip
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- models (same as nanotrain)
class Block(nn.Module):
    def __init__(self, C, H, p):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.H, self.p = H, p

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.p if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.dropout(self.c_proj(y), self.p, self.training)
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + F.dropout(self.mlp_proj(h), self.p, self.training)


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V, p):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, p) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.p = p
        for n, w in self.named_parameters():
            if w.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(w, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(w)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = F.dropout(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)), self.p,
                      self.training)
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()   # tied head
        # autocast runs cross_entropy in fp32, as in nanoGPT
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class CNN(nn.Module):
    def __init__(self, c1=32, c2=64, hidden=256):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c1, 3, padding=1)
        self.conv3 = nn.Conv2d(c1, c2, 3, padding=1)
        self.conv4 = nn.Conv2d(c2, c2, 3, padding=1)
        self.fc1 = nn.Linear(c2 * 49, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.max_pool2d(F.relu(self.conv4(F.relu(self.conv3(x)))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def adamw(model, lr, betas, wd, capturable=False):
    """nanoGPT's groups: decay on 2-D weights only; fused (one kernel for all tensors)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=betas, fused=True, capturable=capturable)


# autocast_cache: autocast's cache of weight casts must be off inside a CUDA graph capture;
# compiled variants run with it off too (the compiled graph does its own casts), so that the
# graph-compile variants reuse their compiled code rather than recompiling for the flag.
def gpt_step(model, fwd, opt, x, y, zero=True, cache=True):
    """One training step as nanoGPT takes it: bf16 autocast, clip 1.0, AdamW. zero=False inside
    a CUDA graph (the gradients stay in the graph's pool)."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=cache):
        loss = fwd(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if zero:
        opt.zero_grad(set_to_none=True)
    return loss


def cnn_step(model, fwd, opt, scaler, x, y, zero=True, cache=True):
    """fp16 autocast, scaled loss, unscale, clip 1.0, scaler step (fused AdamW takes the
    found-inf flag on the device: no host sync) and update."""
    with torch.autocast(x.device.type, dtype=torch.float16, cache_enabled=cache):
        loss = F.cross_entropy(fwd(x).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    if zero:
        opt.zero_grad(set_to_none=True)
    return loss


# ---------------------------------------------------------------- timing and memory
class Clock:
    """Marks on the GPU's compute stream (CUDA events), or host time on the CPU (smoke)."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else 1e3 * (b - a)


def summary(step_ms, items_per_step):
    med = statistics.median(step_ms)
    return {"step_ms": med, "min_ms": min(step_ms), "max_ms": max(step_ms),
            "items_per_s": items_per_step / med * 1e3, "windows_ms": step_ms}


def time_windows(step, clock, warm, windows, n, items_per_step, reset_peak=True):
    """step(i) runs training step i. Warm-up, one sync, then `windows` windows of n steps
    timed by marks at their ends, read once at the end. The peak-memory count restarts after
    the warm-up (compilation may need more than the steps), unless reset_peak is False: a
    CUDA graph's replays use its private pool, which the allocated-bytes count leaves out
    once the capture has ended, so a graph variant's peak is the one of its warm-up steps and
    capture."""
    for i in range(warm):
        loss = step(i)
    clock.sync()
    if clock.cuda and reset_peak:
        torch.cuda.reset_peak_memory_stats()
    marks = [clock.mark()]
    for w in range(windows):
        for j in range(n):
            loss = step(warm + w * n + j)
        marks.append(clock.mark())
    clock.sync()
    r = summary([clock.ms(marks[k], marks[k + 1]) / n for k in range(windows)], items_per_step)
    r["loss"] = float(loss.detach())
    return r


def fresh_memory(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def allocated(dev):
    return torch.cuda.memory_allocated() if dev.type == "cuda" else 0


def peak_mib(dev, base):
    return (torch.cuda.max_memory_allocated() - base) / 2**20 if dev.type == "cuda" else float("nan")


def graph_stepper(opt, run, feed, warm_steps=3):
    """The whole step as one CUDA graph, as PyTorch's documentation shows it. run(zero) takes
    a step on the static inputs and returns the loss; feed(i) copies batch i into them. Warm-up
    steps on a side stream (lazy state, cuDNN/Triton autotuning, compilation), gradients set to
    None so that backward allocates them from the graph's pool, then one captured step.
    Returns step(i): feed, replay (on the current stream), the static loss."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm_steps):
            run(zero=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loss = run(zero=False)
    torch.cuda.synchronize()

    def step(i):
        feed(i)
        g.replay()
        return loss
    return step


# ---------------------------------------------------------------- PyTorch GPT
def gpt_batches(tokens, B, T, count, dev, seed=0):
    """count batches of B random windows (x, y = the window shifted by one), on the device."""
    g = torch.Generator().manual_seed(seed)
    data = torch.as_tensor(tokens, dtype=torch.long)
    out = []
    for _ in range(count):
        ix = torch.randint(len(data) - T - 1, (B,), generator=g)
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
        out.append((x.to(dev), y.to(dev)))
    return out


def gpt_stepper(cfg, variant, batches, dev, a, cache):
    """A PyTorch GPT variant's step(i) and its vocabulary. cache keeps the compiled model
    between variants (graph-compile reuses the one compile or compile-pad built rather than
    compiling again)."""
    V = cfg["Vp"] if variant == "compile-pad" or variant.startswith("graph") else cfg["V"]
    compiled = variant.endswith(("compile", "compile-pad"))
    key = (V, compiled)
    if compiled and key in cache:
        model, fwd = cache[key]
    else:
        if compiled:
            cache.clear()
            torch._dynamo.reset()
        fresh_memory(dev)
        torch.manual_seed(0)
        model = GPT(cfg["L"], cfg["H"], cfg["C"], cfg["T"], V, cfg["p"]).to(dev)
        fwd = torch.compile(model) if compiled else model
        if compiled:
            cache[key] = (model, fwd)
    model.zero_grad(set_to_none=True)
    fresh_memory(dev)
    graph = variant.startswith("graph")
    cache_casts = not (graph or compiled)   # see autocast_cache
    opt = adamw(model, 1e-3, (0.9, 0.99), 0.1, capturable=graph)
    if not graph:
        def step(i):
            return gpt_step(model, fwd, opt, *batches[i % len(batches)], cache=cache_casts)
        return step, V, None
    sx, sy = (t.clone() for t in batches[0])

    def feed(i):
        x, y = batches[i % len(batches)]
        sx.copy_(x, non_blocking=True)
        sy.copy_(y, non_blocking=True)
    return graph_stepper(opt, lambda zero: gpt_step(model, fwd, opt, sx, sy, zero=zero,
                                                    cache=cache_casts), feed), V, None


def torch_gpt(cfg, variant, batches, dev, clock, a, cache):
    step, V, _ = gpt_stepper(cfg, variant, batches, dev, a, cache)
    r = time_windows(step, clock, a.skip * cfg["window"], a.windows, cfg["window"],
                     cfg["B"] * cfg["T"], reset_peak=not variant.startswith("graph"))
    r.update(peak_mib=peak_mib(dev, cfg["mem_base"]), vocab=V)
    return r


# ---------------------------------------------------------------- PyTorch CNN
def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_train(fashion_dir):
    """Normalised images [N, 1, 28, 28] fp32 and labels [N] int64 on the host (the same
    mean/std as nanotrain's loader)."""
    x = read_idx(os.path.join(fashion_dir, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(fashion_dir, "train-labels-idx1-ubyte.gz"))
    xs = torch.from_numpy(x.copy()).float().div_(255).sub_(0.2860).div_(0.3530).unsqueeze(1)
    return xs, torch.from_numpy(y.astype("int64"))


def dataloader_batches(xs, ys, B, workers, dev):
    """Endless (x, y) device batches through a DataLoader, reshuffled each epoch."""
    from torch.utils.data import DataLoader, TensorDataset
    cuda = dev.type == "cuda"
    dl = DataLoader(TensorDataset(xs, ys), batch_size=B, shuffle=True, drop_last=True,
                    num_workers=workers, pin_memory=cuda, persistent_workers=workers > 0)
    while True:
        for xb, yb in dl:
            yield xb.to(dev, non_blocking=cuda), yb.to(dev, non_blocking=cuda)


def cnn_stepper(cfg, variant, data, dev, a, cache):
    """A PyTorch CNN variant's step(i) and what ends it (the DataLoader's workers)."""
    xs, ys, gx, gy, order = data
    B = cfg["B"]
    compiled = variant.endswith("compile")
    graph = variant.startswith("graph")
    cache_casts = not (graph or compiled)   # see autocast_cache
    cl = variant != "dataloader"
    fmt = torch.channels_last if cl else torch.contiguous_format
    key = ("compiled", fmt)
    if compiled and key in cache:
        model, fwd = cache[key]
    else:
        torch.manual_seed(0)
        model = CNN(*cfg["widths"]).to(dev).to(memory_format=fmt)
        fwd = torch.compile(model) if compiled else model
        if compiled:
            cache[key] = (model, fwd)
    model.zero_grad(set_to_none=True)
    fresh_memory(dev)
    opt = adamw(model, 1e-3, (0.9, 0.999), 0.05, capturable=graph)
    scaler = torch.amp.GradScaler(dev.type, growth_interval=1000)
    nb = order.shape[0]

    def gather(i, out_x=None, out_y=None):
        idx = order[i % nb]
        return (torch.index_select(gx, 0, idx, out=out_x),
                torch.index_select(gy, 0, idx, out=out_y))

    it = dataloader_batches(xs, ys, B, a.cnn_workers, dev) if variant == "dataloader" else None
    if it is not None:
        def step(i):
            return cnn_step(model, fwd, opt, scaler, *next(it))
    elif not graph:
        def step(i):
            return cnn_step(model, fwd, opt, scaler, *gather(i), cache=cache_casts)
    else:
        sx, sy = (t.clone() for t in gather(0))
        step = graph_stepper(opt, lambda zero: cnn_step(model, fwd, opt, scaler, sx, sy,
                                                        zero=zero, cache=cache_casts),
                             lambda i: gather(i, sx, sy))
    return step, None, it.close if it is not None else None   # the workers end with it


def torch_cnn(cfg, variant, data, dev, clock, a, cache):
    step, _, end = cnn_stepper(cfg, variant, data, dev, a, cache)
    try:
        r = time_windows(step, clock, a.skip * cfg["window"], a.windows, cfg["window"], cfg["B"],
                         reset_peak=not variant.startswith("graph"))
    finally:
        if end:   # no loader thread may linger into a later variant's graph capture
            end()
    r.update(peak_mib=peak_mib(dev, cfg["mem_base"]))
    return r


# ---------------------------------------------------------------- nanotrain
def nanotrain(a, name, args, window, items_per_step, log_dir):
    """Runs nanotrain in a temporary directory (its checkpoint is not kept: GPT-2's is large);
    log_dir/name gets its output and metrics.jsonl."""
    steps = (a.skip + a.windows) * window
    with tempfile.TemporaryDirectory(prefix="bench_train_") as d:
        cmd = ([a.train] + args + ["--device", a.device, "--max-iters", str(steps),
                                   "--log-interval", str(window), "--out-dir", d, "--no-progress"])
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        metrics = os.path.join(d, "metrics.jsonl")
        recs = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
        if log_dir:
            keep = os.path.join(log_dir, name)
            os.makedirs(keep, exist_ok=True)
            with open(os.path.join(keep, "stdout.log"), "w") as f:
                f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
            if recs:
                shutil.copy(metrics, keep)
    if r.returncode:
        raise RuntimeError(f"nanotrain exited {r.returncode}: {' '.join(cmd)}\n"
                           f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    evals = [x["step"] for x in recs if x["kind"] == "eval"]
    train = sorted((x for x in recs if x["kind"] == "train" and "step_ms" in x),
                   key=lambda x: x["step"])
    kept, prev = [], 0
    for k, x in enumerate(train):
        s = x["step"]
        whole = s - prev == window and not any(prev <= e < s for e in evals)
        if k >= a.skip and whole:
            kept.append(x)
        prev = s
    if len(kept) < min(5, a.windows):
        raise RuntimeError(f"nanotrain: {len(kept)} usable log windows in its metrics.jsonl")
    res = summary([x["step_ms"] for x in kept], items_per_step)
    mfu = [x["mfu"] for x in kept if "mfu" in x]
    res.update(peak_mib=max(x.get("mem_peak_bytes", 0) for x in recs) / 2**20,
               loss=train[-1]["loss"], graph="(CUDA graph)" in r.stdout,
               mfu=statistics.median(mfu) if mfu else None, wall_s=time.time() - t0)
    return res


def cudnn_env():
    """The environment with torch's wheel's cuDNN on the library path after the system's (for
    an llm.c built with cuDNN where the system has none)."""
    env, dirs = dict(os.environ), []
    try:
        import nvidia.cudnn
        dirs = [os.path.join(p, "lib") for p in nvidia.cudnn.__path__]
    except ImportError:
        pass
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [env.get("LD_LIBRARY_PATH")] + dirs))
    return env


LLMC_STEP = re.compile(r"^step\s+(\d+)/\d+ \| loss ([-+.\deEnaif]+) .*\| ([\d.]+) ms \|", re.M)


def llmc(a, binary, flags, cfg, toks, items_per_step, log_dir, name):
    """llm.c's train_gpt2cu at the workload's config (the module's docstring says how it is
    timed): a fresh GPT-2 (-e d12: 124M, vocabulary 50257 padded to 50304 as ours), B x T, no
    accumulation, AdamW with fp32 master weights, clip 1.0. Its peak memory is not comparable
    (it reports cudaMemGetInfo's memory in use, the CUDA context included): mem_in_use_mib."""
    B, T, window = cfg["B"], cfg["T"], cfg["window"]
    steps = (a.skip + a.windows) * window
    with tempfile.TemporaryDirectory(prefix="bench_llmc_") as d:
        shard = os.path.join(d, "tokens.bin")
        header = torch.zeros(256, dtype=torch.int32)
        header[:3] = torch.tensor([20240520, 1, len(toks)])   # llm.c's shard header
        with open(shard, "wb") as f:
            f.write(header.numpy().tobytes())
            f.write(toks.to(torch.int32).numpy().astype("<u2").tobytes())
        args = ["-e", "d12", "-b", str(B), "-t", str(T), "-d", str(B * T), "-x", str(steps),
                "-v", str(steps + 1), "-m", "1", "-s", "0", "-l", "6e-4", "-c", "0.1"] + flags
        cmd = [os.path.abspath(binary), "-i", shard, "-j", shard] + args   # runs in d
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=d, env=cudnn_env())
    if log_dir:
        os.makedirs(os.path.join(log_dir, name), exist_ok=True)
        with open(os.path.join(log_dir, name, "stdout.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    found = LLMC_STEP.findall(r.stdout)
    ms = {int(s): float(t) for s, _, t in found}
    if r.returncode or len(ms) < steps:
        raise RuntimeError(f"llm.c exited {r.returncode} after {len(ms)} of {steps} steps: "
                           f"{(r.stdout + r.stderr)[-1500:]}")
    per_window = [statistics.fmean(ms[s] for s in range(1 + w * window, 1 + (w + 1) * window))
                  for w in range(a.skip, a.skip + a.windows)]
    res = summary(per_window, items_per_step)
    used = re.search(r"device memory usage: (\d+) MiB", r.stdout)
    res.update(peak_mib=None, mem_in_use_mib=int(used.group(1)) if used else None,
               loss=float(found[-1][1]), wall_s=time.time() - t0,
               args=" ".join(args))
    return res


# ---------------------------------------------------------------- workloads
def shakespeare_tokens():
    d = os.environ.get("NT_DATA_DIR")
    p = os.path.join(d, "tinyshakespeare.txt") if d else None
    if p and os.path.exists(p):
        text = open(p, "rb").read()
        idx = {c: i for i, c in enumerate(sorted(set(text)))}
        return [idx[c] for c in text], True
    g = torch.Generator().manual_seed(0)
    return torch.randint(65, (1_000_000,), generator=g).tolist(), False


def padded(V):
    return (V + 63) // 64 * 64 if V >= 1024 else V   # nt_gpt_padded_vocab's rule


def gpt_config(name, tiny=False):
    """The GPT workload's shapes (L layers, H heads, C wide, block T, vocabulary V, dropout p,
    per-step batch B, default window); tiny: the CPU smoke shapes. bench_dist_torch.py builds
    its model from the same dictionary."""
    if name == "gpt-char":
        cfg = dict(L=6, H=6, C=384, T=256, V=65, p=0.2, B=64, window=25)
        if tiny:
            cfg.update(L=1, H=2, C=32, T=32, B=4)
    else:
        cfg = dict(L=12, H=12, C=768, T=1024, V=50257, p=0.0, B=16, window=20)
        if tiny:
            cfg.update(L=1, H=2, C=32, T=64, B=2)
    return cfg


def gpt_workload(name, a):
    cfg = gpt_config(name, a.tiny)
    if name == "gpt-char":
        toks, real = shakespeare_tokens()
        nt = ["gpt", "--dtype", "bf16", "--dropout", str(cfg["p"])] + ([] if real else
                                                                        ["--data", "synthetic"])
    else:
        toks = torch.randint(cfg["V"], (4_000_000,), generator=torch.Generator().manual_seed(0))
        nt = ["gpt", "--preset", "gpt2", "--dtype", "bf16", "--data", "synthetic"]
    nt += ["--n-layer", str(cfg["L"]), "--n-head", str(cfg["H"]), "--n-embd", str(cfg["C"]),
           "--block-size", str(cfg["T"]), "--batch-size", str(cfg["B"]), "--eval-interval", "0"]
    cfg["Vp"] = padded(cfg["V"])
    cfg["window"] = a.window or cfg["window"]
    return cfg, toks, nt


def cnn_workload(a):
    cfg = dict(B=256, widths=(32, 64, 256), window=a.window or 26)
    if a.tiny:
        cfg.update(B=16, widths=(4, 8, 16))
    nt = ["cnn", "--dtype", "fp16", "--batch-size", str(cfg["B"]), "--epochs", "1000",
          "--widths", ",".join(map(str, cfg["widths"])), "--data-dir", a.fashion_dir]
    if a.tiny:
        nt += ["--test-subset", "64"]   # its final evaluation
    return cfg, nt


VARIANTS = {"gpt": ["eager", "graph-eager", "compile", "compile-pad", "graph-compile"],
            "cnn": ["dataloader", "gpu-eager", "gpu-compile", "graph-eager", "graph-compile"]}
DEFAULTS = {"gpt-char": ["eager", "graph-eager", "compile", "graph-compile"],
            "gpt2": ["eager", "compile", "compile-pad", "graph-compile"],
            "cnn": VARIANTS["cnn"]}


def run_torch(kind, cfg, variants, a, dev, clock, run_one, data):
    out, cache = {}, {}
    for v in variants:
        if kind == "gpt" and v == "compile-pad" and cfg["Vp"] == cfg["V"]:
            continue                      # no padding at this vocabulary: same as compile
        if "graph" in v and dev.type != "cuda":
            out[v] = {"error": "needs CUDA"}
            continue
        if a.budget_s and time.time() - a.t0 > a.budget_s:
            out[v] = {"error": f"skipped: past the {a.budget_s:.0f} s budget"}
            print(f"  torch {v}: {out[v]['error']}", flush=True)
            continue
        t0 = time.time()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()   # this variant's peak only
        try:
            out[v] = run_one(cfg, v, data, dev, clock, a, cache)
            out[v]["wall_s"] = time.time() - t0
        except Exception as e:   # report and go on with the other variants
            traceback.print_exc()
            out[v] = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"}
        print(f"  torch {v}: " + (f"{out[v]['step_ms']:.3f} ms/step ({time.time() - t0:.0f} s)"
                                  if "step_ms" in out[v] else out[v]["error"]), flush=True)
    cache.clear()
    torch._dynamo.reset()
    return out


def torch_data(name, cfg, toks, dev, a):
    """The torch side's data in GPU memory: 16 GPT batches, or the CNN's data set (host and
    device copies) and a shuffled order of batches covering every step."""
    if name != "cnn":
        return gpt_batches(toks, cfg["B"], cfg["T"], 16, dev)
    xs, ys = fashion_train(a.fashion_dir)
    nb = len(xs) // cfg["B"]
    epochs = -(-(a.skip + a.windows + 1) * cfg["window"] // nb)
    order = torch.cat([torch.randperm(len(xs), device=dev)[:nb * cfg["B"]]
                       for _ in range(epochs)]).view(-1, cfg["B"])
    # fp16 on the GPU (the dtype the first convolution takes under autocast), channels_last
    gx = xs.to(dev, torch.float16).contiguous(memory_format=torch.channels_last)
    return xs, ys, gx, ys.to(dev), order


def workload(name, a, dev, clock):
    kind = "cnn" if name == "cnn" else "gpt"
    variants = [v for v in (a.variants.split(",") if a.variants else DEFAULTS[name])
                if v in VARIANTS[kind]]
    if kind == "gpt":
        cfg, toks, nt_args = gpt_workload(name, a)
        items = cfg["B"] * cfg["T"]
    else:
        cfg, nt_args = cnn_workload(a)
        toks, items = None, cfg["B"]
    print(f"== {name}", flush=True)
    res = {"config": {k: v for k, v in cfg.items()}, "torch": {}}
    # nanotrain in the workload's dtype, and with --nt-fp8 GPT-2 in FP8 too (a row beside it,
    # no torch counterpart: the mission's packages have no Transformer Engine)
    runs = [("nanotrain", name, nt_args)]
    if a.nt_fp8 and name == "gpt2":
        runs.append(("nanotrain_fp8", name + "-fp8",
                     [("fp8" if p == "--dtype" else v) for p, v in zip([""] + nt_args, nt_args)]))
    for key, log_name, args in runs if a.train else []:
        try:
            res[key] = nanotrain(a, log_name, args, cfg["window"], items, a.log_dir)
            print(f"  {key}: {res[key]['step_ms']:.3f} ms/step", flush=True)
        except Exception as e:
            res[key] = {"error": (str(e).splitlines() or [""])[0][:200]}
            print(f"  {key}: {e}", file=sys.stderr, flush=True)
    # llm.c's trainer (GPT-2 only), with and without its cuBLASLt GELU fusions (-ge 2: the
    # forward's GELU and the backward's DGELU in the GEMMs' epilogues, as ours; its default
    # is 0), never recomputing the GELU (-r 0; its default, 1, recomputes it to save memory)
    for binary in a.llmc if name == "gpt2" and dev.type == "cuda" else []:
        for ge in ("0", "2"):
            key = f"{os.path.basename(binary)} -r 0 -ge {ge}"
            res.setdefault("llmc", {})
            try:
                res["llmc"][key] = llmc(a, binary, ["-r", "0", "-ge", ge], cfg, toks, items,
                                        a.log_dir, f"{os.path.basename(binary)}-ge{ge}")
                print(f"  llm.c {key}: {res['llmc'][key]['step_ms']:.3f} ms/step", flush=True)
            except Exception as e:
                res["llmc"][key] = {"error": (str(e).splitlines() or [""])[0][:200]}
                print(f"  llm.c {key}: {e}", file=sys.stderr, flush=True)
    fresh_memory(dev)
    data = torch_data(name, cfg, toks, dev, a)
    cfg["mem_base"] = allocated(dev)   # the data (and anything left before it)
    res["torch"] = run_torch(kind, cfg, variants, a, dev, clock,
                             torch_gpt if kind == "gpt" else torch_cnn, data)
    del data
    fresh_memory(dev)
    return res


# ---------------------------------------------------------------- report
def table(results, meta):
    units = {"gpt-char": "tokens/s", "gpt2": "tokens/s", "cnn": "images/s"}
    lines = ["| workload | side | step ms (median) | min-max ms | items/s | peak MiB | "
             "step / nanotrain's |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        nt = r.get("nanotrain", {})
        rows = [("nanotrain" + (" (CUDA graph)" if nt.get("graph") else ""), nt)]
        if "nanotrain_fp8" in r:
            f8 = r["nanotrain_fp8"]
            rows.append(("nanotrain --dtype fp8" + (" (CUDA graph)" if f8.get("graph") else ""), f8))
        rows += [(f"torch {v}" + (f" V={x['vocab']}" if "vocab" in x else ""), x)
                 for v, x in r["torch"].items()]
        rows += [(f"llm.c {k}", x) for k, x in r.get("llmc", {}).items()]
        for side, x in rows:
            if "step_ms" not in x:
                lines.append(f"| {name} | {side} | {x.get('error', 'not run')} | | | | |")
                continue
            ratio = (f"{x['step_ms'] / nt['step_ms']:.2f}x"
                     if "step_ms" in nt and side.startswith(("torch", "llm.c")) else "")
            peak = "n/a (a)" if x["peak_mib"] is None else f"{x['peak_mib']:,.0f}"
            lines.append(f"| {name} | {side} | {x['step_ms']:.3f} | {x['min_ms']:.3f}-"
                         f"{x['max_ms']:.3f} | {x['items_per_s']:,.0f} {units[name]} | "
                         f"{peak} | {ratio} |")
    lines.append("")
    for name, r in results.items():
        nt = r.get("nanotrain", {})
        done = [(x["step_ms"], v) for v, x in r["torch"].items() if "step_ms" in x]
        if done and "step_ms" in nt:
            ms, v = min(done)
            lines.append(f"{name}: nanotrain {nt['step_ms']:.3f} ms/step, the fastest torch "
                         f"({v}) {ms:.3f} ms/step: nanotrain {ms / nt['step_ms']:.2f}x.")
        done = [(x["step_ms"], k, x) for k, x in r.get("llmc", {}).items() if "step_ms" in x]
        if done and "step_ms" in nt:
            ms, k, x = min(done)
            lines.append(f"{name}: the fastest llm.c ({k}) {ms:.3f} ms/step: nanotrain "
                         f"{ms / nt['step_ms']:.2f}x. (a) llm.c's memory in use after its "
                         f"allocations, CUDA context included: {x['mem_in_use_mib']} MiB; llm.c "
                         "times each step with CUDA events and synchronises after it (its loop "
                         "reads the loss and norm every step).")
        f8 = r.get("nanotrain_fp8", {})
        if "step_ms" in f8 and "step_ms" in nt:
            lines.append(f"{name}: nanotrain --dtype fp8 {f8['step_ms']:.3f} ms/step: "
                         f"{nt['step_ms'] / f8['step_ms']:.3f}x the tokens/s of the bf16 run.")
    lines.append(f"{meta['windows']} timed windows of ("
                 + ", ".join(f"{k}: {v}" for k, v in meta['window'].items())
                 + f") steps after {meta['skip']} warm-up windows; torch {meta['torch']}, "
                 f"{meta['gpu']}; nanotrain at {meta['commit']}. step / nanotrain's > 1: "
                 "nanotrain faster.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default="build/nanotrain",
                    help="nanotrain binary ('' skips the nanotrain side)")
    ap.add_argument("--only", default="gpt-char,gpt2,cnn")
    ap.add_argument("--nt-fp8", action="store_true",
                    help="gpt2: also time nanotrain with --dtype fp8 (a row beside bf16's)")
    ap.add_argument("--llmc", action="append", default=[], metavar="BIN",
                    help="gpt2: also time llm.c's train_gpt2cu built by bench/build_llmc.sh "
                         "(repeatable: with and without cuDNN, say)")
    ap.add_argument("--variants", default="",
                    help="PyTorch variants to run, in this order (default: the starred ones above): " +
                    ", ".join(dict.fromkeys(VARIANTS["gpt"] + VARIANTS["cnn"])))
    ap.add_argument("--windows", type=int, default=7, help="timed windows (>= 5)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up windows")
    ap.add_argument("--window", type=int, default=0,
                    help="steps per window (default gpt-char 25, gpt2 20, cnn 26)")
    ap.add_argument("--cnn-workers", type=int, default=4)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--fashion-dir", default=os.environ.get("NT_FASHION_DIR",
                                                            "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--log-dir", default="", help="keep nanotrain's logs and metrics here")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="torch variants that would start past this many seconds are skipped "
                         "(reported as such; 0: no limit)")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.t0 = time.time()
    if a.windows < 5 and not a.tiny:
        ap.error("--windows must be >= 5 (medians of at least 5 windows)")
    dev = torch.device(a.device)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device visible to torch (use --device cpu --tiny for a smoke run)")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    clock = Clock(dev)
    names = a.only.split(",")
    for name in names:
        if name not in DEFAULTS:
            ap.error(f"unknown workload {name}")
    # "-dirty" when the tree differs from HEAD (a device copy of a working tree, say)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout
    meta = {"torch": torch.__version__, "commit": commit.strip() or "?",
            "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "CPU",
            "windows": a.windows, "skip": a.skip, "window": {},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    results = {}
    for name in names:
        try:
            results[name] = workload(name, a, dev, clock)
        except Exception as e:   # e.g. a data set missing: the other workloads still run
            traceback.print_exc()
            results[name] = {"config": {"window": 0}, "torch": {},
                             "nanotrain": {"error": f"workload failed: {type(e).__name__}: {e}"}}
        meta["window"][name] = results[name]["config"]["window"]
        if a.json:   # after each workload: a run cut short keeps what it measured
            with open(a.json, "w") as f:
                json.dump({"meta": meta, "results": results}, f, indent=1)
    print()
    print(table(results, meta))


if __name__ == "__main__":
    main()
