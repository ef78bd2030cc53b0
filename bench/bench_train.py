#!/usr/bin/env python3
"""Training speed and memory, nanotrain vs PyTorch on the same GPU in the same run.

Workloads (same model, config, dtype and batch on both sides):
  gpt-char   nanoGPT shakespeare_char: 6/6/384, block 256, batch 64, dropout 0.2, bf16;
             PyTorch eager and torch.compile
  gpt2       GPT-2 124M: 12/12/768, block 1024, vocab 50257, batch 16, dropout 0, bf16;
             PyTorch torch.compile (and eager)
  cnn        the Fashion-MNIST CNN, batch 128, fp16 + GradScaler, PyTorch with a DataLoader
             (2 workers, pinned memory) vs nanotrain's loader

nanotrain runs as a subprocess (build/nanotrain) and reports through its metrics.jsonl; PyTorch
runs in this process. Step times are medians after warm-up; memory is the peak allocated by
each side's allocator (torch.cuda.max_memory_allocated / nanotrain's pool peak).

  python3 bench/bench_train.py --train build/nanotrain [--only gpt-char,gpt2,cnn] [--steps N]
Prints a table (and --json FILE writes the numbers).
"""
import argparse
import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

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
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


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


def adamw(model, lr, betas, wd):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=betas, fused=True)


# ---------------------------------------------------------------- PyTorch timing
def gpt_step(model, fwd, opt, x, y):
    """One training step as nanoGPT takes it: bf16 autocast, clip 1.0, AdamW."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fwd(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def torch_gpt(cfg, B, steps, compile_, tokens):
    torch.manual_seed(0)
    dev = "cuda"
    model = GPT(cfg["L"], cfg["H"], cfg["C"], cfg["T"], cfg["V"], cfg["p"]).to(dev)
    opt = adamw(model, 1e-3, (0.9, 0.99), 0.1)
    fwd = torch.compile(model) if compile_ else model
    T = cfg["T"]
    data = torch.as_tensor(tokens, dtype=torch.long)

    def batch():
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
        return x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)

    torch.cuda.reset_peak_memory_stats()
    times = []
    warm = 10 if compile_ else 5
    for i in range(warm + steps):
        t0 = time.perf_counter()
        loss = gpt_step(model, fwd, opt, *batch())
        torch.cuda.synchronize()
        if i >= warm:
            times.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(times)
    return {"step_ms": ms, "items_per_s": B * T / (ms / 1e3),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20, "loss": loss.item()}


def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def torch_cnn(B, epochs, fashion_dir):
    from torch.utils.data import DataLoader, TensorDataset
    x = read_idx(os.path.join(fashion_dir, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(fashion_dir, "train-labels-idx1-ubyte.gz"))
    xs = (torch.from_numpy(x.copy()).float().div_(255).sub_(0.2860).div_(0.3530)).unsqueeze(1)
    ds = TensorDataset(xs, torch.from_numpy(y.astype("int64")))
    dl = DataLoader(ds, batch_size=B, shuffle=True, drop_last=True, num_workers=2,
                    pin_memory=True, persistent_workers=True)
    torch.manual_seed(0)
    model = CNN().cuda().to(memory_format=torch.contiguous_format)
    opt = adamw(model, 1e-3, (0.9, 0.999), 0.05)
    scaler = torch.amp.GradScaler("cuda", growth_interval=1000)
    torch.cuda.reset_peak_memory_stats()
    rates = []
    for ep in range(epochs):
        n, t0 = 0, time.perf_counter()
        for xb, yb in dl:
            xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(xb).float(), yb)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            n += xb.shape[0]
        torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - t0))
    return {"items_per_s": rates[-1], "step_ms": 1e3 * B / rates[-1],
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20, "loss": loss.item()}


# ---------------------------------------------------------------- nanotrain
def ours(train, args, skip_records=2):
    with tempfile.TemporaryDirectory() as d:
        cmd = [train] + args + ["--out-dir", d, "--no-progress"]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"nanotrain failed: {' '.join(cmd)}")
        recs = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    train_recs = [x for x in recs if x["kind"] == "train" and "step_ms" in x]
    steady = train_recs[skip_records:] or train_recs
    ms = statistics.median(x["step_ms"] for x in steady)
    key = "tokens_per_sec" if "tokens_per_sec" in steady[0] else "images_per_sec"
    return {"step_ms": ms, "items_per_s": statistics.median(x[key] for x in steady),
            "peak_mib": max(x.get("mem_peak_bytes", 0) for x in recs) / 2**20,
            "loss": train_recs[-1]["loss"], "graph": "(CUDA graph)" in r.stdout,
            "wall_s": time.time() - t0}


def shakespeare_tokens():
    d = os.environ.get("NT_DATA_DIR")
    p = os.path.join(d, "tinyshakespeare.txt") if d else None
    if p and os.path.exists(p):
        text = open(p, "rb").read()
        vocab = sorted(set(text))
        idx = {c: i for i, c in enumerate(vocab)}
        return [idx[c] for c in text], len(vocab)
    g = torch.Generator().manual_seed(0)
    return torch.randint(65, (1_000_000,), generator=g).tolist(), 65


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default="build/nanotrain")
    ap.add_argument("--only", default="gpt-char,gpt2,cnn")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--cnn-epochs", type=int, default=2)
    ap.add_argument("--fashion-dir", default=os.environ.get("NT_FASHION_DIR",
                                                            "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--json")
    a = ap.parse_args()
    todo = a.only.split(",")
    rows, out = [], {}
    torch.backends.cuda.matmul.allow_tf32 = True

    if "gpt-char" in todo:
        toks, V = shakespeare_tokens()
        cfg = dict(L=6, H=6, C=384, T=256, V=V, p=0.2)
        o = ours(a.train, ["gpt", "--dtype", "bf16", "--max-iters", str(a.steps + 60),
                           "--eval-interval", "0", "--log-interval", "20"]
                 + ([] if os.environ.get("NT_DATA_DIR") else ["--data", "synthetic"]))
        te = torch_gpt(cfg, 64, a.steps, False, toks)
        tc = torch_gpt(cfg, 64, a.steps, True, toks)
        out["gpt-char"] = {"nanotrain": o, "torch_eager": te, "torch_compile": tc}
        rows.append(("gpt-char step ms (bf16, 64x256)", o["step_ms"], te["step_ms"], tc["step_ms"],
                     "<= 0.5x eager", o["step_ms"] <= 0.5 * te["step_ms"]))
        rows.append(("gpt-char peak MiB", o["peak_mib"], te["peak_mib"], tc["peak_mib"],
                     "<= torch", o["peak_mib"] <= min(te["peak_mib"], tc["peak_mib"])))
        torch.cuda.empty_cache()
    if "gpt2" in todo:
        toks = torch.randint(50257, (4_000_000,)).tolist()
        cfg = dict(L=12, H=12, C=768, T=1024, V=50257, p=0.0)
        o = ours(a.train, ["gpt", "--preset", "gpt2", "--batch-size", "16", "--dtype", "bf16",
                           "--max-iters", str(max(30, a.steps // 2) + 20), "--eval-interval", "0",
                           "--log-interval", "10", "--data", "synthetic"])
        steps = max(20, a.steps // 2)
        te = torch_gpt(cfg, 16, steps, False, toks)
        tc = torch_gpt(cfg, 16, steps, True, toks)
        out["gpt2"] = {"nanotrain": o, "torch_eager": te, "torch_compile": tc}
        rows.append(("gpt2-124M tokens/s (bf16, 16x1024)", o["items_per_s"], te["items_per_s"],
                     tc["items_per_s"], ">= compile", o["items_per_s"] >= tc["items_per_s"]))
        rows.append(("gpt2-124M peak MiB", o["peak_mib"], te["peak_mib"], tc["peak_mib"],
                     "<= torch", o["peak_mib"] <= min(te["peak_mib"], tc["peak_mib"])))
        torch.cuda.empty_cache()
    if "cnn" in todo:
        o = ours(a.train, ["cnn", "--dtype", "fp16", "--epochs", str(a.cnn_epochs),
                           "--log-interval", "50"], skip_records=4)
        t = torch_cnn(128, a.cnn_epochs, a.fashion_dir)
        out["cnn"] = {"nanotrain": o, "torch_dataloader": t}
        rows.append(("cnn images/s (fp16, batch 128)", o["items_per_s"], t["items_per_s"],
                     float("nan"), ">= 2x torch", o["items_per_s"] >= 2 * t["items_per_s"]))
        rows.append(("cnn peak MiB", o["peak_mib"], t["peak_mib"], float("nan"), "<= torch",
                     o["peak_mib"] <= t["peak_mib"]))

    print(f"{'metric':38s} {'nanotrain':>11s} {'torch':>11s} {'compile':>11s}  target        ok")
    for name, ours_v, te, tc, target, ok in rows:
        print(f"{name:38s} {ours_v:11.1f} {te:11.1f} {tc:11.1f}  {target:12s} {'yes' if ok else 'NO'}")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
