"""torch DataLoader (num_workers 4, pin_memory) feeding the batches bench_loader.c measures:
Fashion-MNIST train images normalized to F32 [256, 1, 28, 28] plus labels, shuffled, drop_last,
into a synthetic ~3 ms compute step (calibrated fills of a 256 MiB buffer on the current
stream). Reports ms/step against compute alone, the data wait %, images/s and the host time
blocked in next(). Median of 5 repeats after a warm-up. Prints "RESULT torch_<key> <value>".
Usage: python3 bench/bench_loader.py [--steps N]"""
import argparse
import gzip
import os
import statistics
import struct
import time

import numpy as np
import torch

MEAN, STD = 0.2860, 0.3530
REPEATS = 5


def load_fashion():
    d = os.environ.get("NT_FASHION_DIR") or "/usr/share/datasets/fashion-mnist"
    ip = os.path.join(d, "train-images-idx3-ubyte.gz")
    lp = os.path.join(d, "train-labels-idx1-ubyte.gz")
    if not (os.path.exists(ip) and os.path.exists(lp)):
        rng = np.random.default_rng(1)
        return rng.integers(0, 256, (60000, 28, 28), dtype=np.uint8), np.arange(60000) % 10, True
    with gzip.open(ip) as f:
        magic, n, h, w = struct.unpack(">IIII", f.read(16))
        assert magic == 0x803
        x = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, h, w)
    with gzip.open(lp) as f:
        magic, n = struct.unpack(">II", f.read(8))
        assert magic == 0x801
        y = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
    return x, y, False


class Images(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        img = torch.from_numpy(self.x[i]).float().div_(255.0).sub_(MEAN).div_(STD)
        return img.unsqueeze(0), int(self.y[i])


def busy(scratch, n):
    for k in range(n):
        scratch.fill_(k & 0xFF)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    steps = args.steps
    dev = torch.device("cuda")
    x, y, synthetic = load_fashion()
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    sink = torch.empty(256, 1, 28, 28, device=dev)
    busy(scratch, 8)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    busy(scratch, 40)
    e1.record()
    e1.synchronize()
    memsets = max(1, round(3.0 / (e0.elapsed_time(e1) / 40)))

    loader = torch.utils.data.DataLoader(
        Images(x, y), batch_size=256, shuffle=True, drop_last=True, num_workers=args.workers,
        pin_memory=True, prefetch_factor=2, persistent_workers=True)
    it = iter(loader)
    epoch = 0

    def next_batch():
        nonlocal it, epoch
        try:
            return next(it)
        except StopIteration:
            epoch += 1
            it = iter(loader)
            return next(it)

    tc, tl, hw = [], [], []
    for r in range(-1, REPEATS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            busy(scratch, memsets)
        torch.cuda.synchronize()
        if r >= 0:
            tc.append(time.perf_counter() - t)
        waited = 0.0
        t = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            xb, yb = next_batch()
            waited += time.perf_counter() - t0
            xb = xb.to(dev, non_blocking=True)
            yb = yb.to(dev, non_blocking=True)
            sink.copy_(xb)
            busy(scratch, memsets)
        torch.cuda.synchronize()
        if r >= 0:
            tl.append(time.perf_counter() - t)
            hw.append(1e3 * waited / steps)
    cms = 1e3 * statistics.median(tc) / steps
    lms = 1e3 * statistics.median(tl) / steps
    wait = max(0.0, (lms - cms) / lms * 100)
    print(f"torch DataLoader on {torch.cuda.get_device_name()} (torch {torch.__version__}, "
          f"median of {REPEATS} repeats)")
    print(f"{'CNN step: compute alone':44s} {cms:9.3f} ms   ({memsets} fills)")
    print(f"{'CNN step: with DataLoader (bs 256, 4 workers)':44s} {lms:9.3f} ms")
    print(f"{'data wait / step time':44s} {wait:9.3f} %")
    print(f"{'host time blocked in next() / step':44s} {statistics.median(hw):9.3f} ms")
    print(f"{'images / s with DataLoader':44s} {256 / (lms * 1e-3):9.0f}")
    if synthetic:
        print("(Fashion-MNIST not found: synthetic images of the same shape)")
    print(f"RESULT torch_compute_ms {cms:.4f}\nRESULT torch_loop_ms {lms:.4f}\n"
          f"RESULT torch_wait_pct {wait:.3f}\nRESULT torch_images_per_s {256 / (lms * 1e-3):.0f}")


if __name__ == "__main__":
    main()
