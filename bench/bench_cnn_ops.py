"""torch (cuDNN) at the shapes bench_cnn_ops.c times: the CNN's four 3x3 convolutions (forward,
forward + ReLU, data gradient, weight + bias gradient through aten.convolution_backward), its two
2x2 max-pools (aten.max_pool2d_with_indices and its backward), and the whole CNN as an nn.Module,
forward + cross-entropy + backward (f16: torch.autocast(float16) over fp32 parameters, as a
PyTorch user trains with a GradScaler; bf16: autocast(bfloat16); f32: plain, TF32 allowed as
cuDNN's default). Batch 256 (--batch), 28x28.

Each op: `steps` calls per sample between CUDA events, median per call over `repeats` samples
after warm-up, eager and replayed from one CUDA graph of the `steps` calls. Both memory formats
(channels-first and torch.channels_last) are timed; the faster is reported with its name.
Lines: "RESULT torch dtype op mode ms format".
Usage: python3 bench/bench_cnn_ops.py [--dtype f16|bf16|f32|all] [--batch 256] [--repeats 20]
       [--steps 20]"""
import argparse
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

NB = 256
CONVS = [(1, 32, 28), (32, 32, 28), (32, 64, 14), (64, 64, 14)]  # Cin, Cout, H=W
POOLS = [(32, 28), (64, 14)]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def median_ms(fn, graph, repeats, steps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    run = None
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(steps):
                fn()
        g.replay()
        run = g.replay
    else:
        def run():
            for _ in range(steps):
                fn()
    times = []
    for _ in range(repeats):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / steps)
    return statistics.median(times)


def op_fns(dt, fmt, dev):
    """(name, callable) for every single op at the CNN's shapes in dtype dt and format fmt."""
    out = []
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, std=1.0):
        t = torch.randn(*shape, device=dev, generator=g) * std
        t = t.to(dt)
        return t.contiguous(memory_format=fmt) if t.dim() == 4 else t

    for i, (cin, cout, hw) in enumerate(CONVS):
        x, w, b = rnd(NB, cin, hw, hw), rnd(cout, cin, 3, 3, std=0.1), rnd(cout, std=0.1)
        dy = rnd(NB, cout, hw, hw)
        n = f"conv{i + 1}"

        def fwd(x=x, w=w, b=b):
            with torch.no_grad():
                return F.conv2d(x, w, b, 1, 1)

        def fwd_relu(x=x, w=w, b=b):
            with torch.no_grad():
                return F.relu(F.conv2d(x, w, b, 1, 1))

        def bwd(mask, x=x, w=w, dy=dy):
            return torch.ops.aten.convolution_backward(dy, x, w, [w.shape[0]], [1, 1], [1, 1],
                                                       [1, 1], False, [0, 0], 1, mask)

        out += [(f"{n}_fwd", fwd), (f"{n}_fwd_relu", fwd_relu)]
        if i > 0:
            out.append((f"{n}_dx", lambda bwd=bwd: bwd([True, False, False])))
        out.append((f"{n}_dw_db", lambda bwd=bwd: bwd([False, True, True])))
    for i, (c, hw) in enumerate(POOLS):
        x = rnd(NB, c, hw, hw)
        y, idx = torch.ops.aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
        dy = rnd(*y.shape)
        n = f"pool{i + 1}"
        out.append((f"{n}_fwd", lambda x=x: torch.ops.aten.max_pool2d_with_indices(
            x, [2, 2], [2, 2])))
        out.append((f"{n}_bwd", lambda x=x, dy=dy, idx=idx:
                    torch.ops.aten.max_pool2d_with_indices_backward(
                        dy, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)))
    return out


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(3136, 256), nn.ReLU(),
                                  nn.Linear(256, 10))

    def forward(self, x):
        return self.head(self.features(x))


def model_fn(dt, fmt, dev, cache=True):
    """One training step's forward + backward (no optimizer). CUDA graph capture needs the
    autocast weight-cast cache off (cache=False)."""
    torch.manual_seed(0)
    m = CNN().to(dev).to(memory_format=fmt)
    x = torch.randn(NB, 1, 28, 28, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (NB,), device=dev)
    auto = dt != torch.float32

    def step():
        with torch.autocast("cuda", dtype=dt, enabled=auto, cache_enabled=cache):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
    return step


def main():
    global NB
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="all")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=NB)
    args = ap.parse_args()
    NB = args.batch
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}, batch {NB}, median of {args.repeats} x "
          f"{args.steps} calls, best of nchw / channels_last")
    for dn, dt in DTYPES.items():
        if args.dtype not in ("all", dn):
            continue
        best = {}
        order = []
        for fname, fmt in FORMATS.items():
            fns = op_fns(dt, fmt, dev) + [("model_fwd_bwd", None)]
            for name, fn in fns:
                if name not in order:
                    order.append(name)
                for mode in ("graph", "eager"):
                    if name == "model_fwd_bwd":
                        fn = model_fn(dt, fmt, dev, cache=mode == "eager")
                    try:
                        ms = median_ms(fn, mode == "graph", args.repeats, args.steps)
                    except Exception as e:  # a capture torch refuses: report, keep going
                        print(f"# {dn} {name} {mode} {fname}: {type(e).__name__}: {e}")
                        continue
                    k = (name, mode)
                    if k not in best or ms < best[k][0]:
                        best[k] = (ms, fname)
        for name in order:
            for mode in ("graph", "eager"):
                if (name, mode) in best:
                    ms, fname = best[(name, mode)]
                    print(f"RESULT torch {dn} {name} {mode} {ms:.4f} {fname}")
        for mode in ("graph", "eager"):
            if ("model_fwd_bwd", mode) in best:
                ms = best[("model_fwd_bwd", mode)][0]
                print(f"# torch {dn} model fwd+bwd ({mode}): {ms:.3f} ms = "
                      f"{NB / ms * 1e3 / 1e3:.1f}k images/s (no optimizer, no data loader)")


if __name__ == "__main__":
    main()
