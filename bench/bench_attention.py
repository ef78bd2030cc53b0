"""torch.nn.functional.scaled_dot_product_attention(is_causal=True) forward, backward and
forward+backward in bf16 on the rows bench_attention.c times, with CUDA events (median of
repeats after warm-up; --calls N times N calls in a row per sample, ms per call): two plain
shapes, the small GPT's shape with dropout_p=0.2, and the same shape with q, k, v as views of
one [B, T, 3C] tensor (the gradient lands in it, as in nanoGPT's attention), and GPT-2's shape
with dropout_p=0.1. Prints a table and "RESULT torch <row> <fwd> <bwd> <total>" (ms).
Usage: python3 bench/bench_attention.py [--repeats N] [--calls N]"""
import argparse
import statistics

import torch
import torch.nn.functional as F

# (B, H, T, D, dropout_p, q/k/v as views of [B, T, 3C])
ROWS = [(64, 6, 256, 64, 0.0, False), (16, 12, 1024, 64, 0.0, False),
        (64, 6, 256, 64, 0.2, False), (64, 6, 256, 64, 0.0, True),
        (16, 12, 1024, 64, 0.1, False)]


def median_ms(fn, reps, calls):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--calls", type=int, default=1)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} scaled_dot_product_attention(is_causal=True), bf16, "
          f"{torch.cuda.get_device_name()}, median of {args.repeats} samples of "
          f"{args.calls} call(s)")
    print(f"{'B,H,T,D':<26} {'fwd ms':>10} {'bwd ms':>10} {'fwd+bwd ms':>10} {'TFLOP/s':>12}")
    g = torch.Generator(device=dev).manual_seed(0)
    for (B, H, T, D, p, packed) in ROWS:
        def rnd(*shape):
            return (torch.rand(*shape, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        if packed:
            leaf = rnd(B, T, 3 * H * D).requires_grad_(True)
            leaves = (leaf,)

            def qkv():
                return leaf.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            leaves = tuple(rnd(B, H, T, D).requires_grad_(True) for _ in range(3))

            def qkv():
                return leaves
        dout = rnd(B, H, T, D)

        def attn():
            q, k, v = qkv()
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)

        with torch.no_grad():
            fwd = median_ms(attn, args.repeats, args.calls)
        out = attn()

        def bwd_only():
            torch.autograd.grad(out, leaves, dout, retain_graph=True)

        def both():
            torch.autograd.grad(attn(), leaves, dout)

        bwd = median_ms(bwd_only, args.repeats, args.calls)
        fb = median_ms(both, args.repeats, args.calls)
        flops = 3.5 * 4.0 * B * H * T * T * D / 2.0
        name = f"{B},{H},{T},{D}" + (f",p={p:g}" if p > 0 else ",qkv-views" if packed else "")
        print(f"{name:<26} {fwd:10.3f} {bwd:10.3f} {fb:10.3f} {flops / (fb * 1e-3) / 1e12:12.1f}")
        print(f"RESULT torch {name} {fwd:.4f} {bwd:.4f} {fb:.4f}")


if __name__ == "__main__":
    main()
