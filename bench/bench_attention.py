"""torch.nn.functional.scaled_dot_product_attention(is_causal=True) forward, backward and
forward+backward in bf16 on the shapes bench_attention.c times, with CUDA events (median of
repeats after warm-up). Prints a table and "RESULT torch <B,H,T,D> <fwd> <bwd> <total>" (ms).
Usage: python3 bench/bench_attention.py [--repeats N]"""
import argparse
import statistics

import torch
import torch.nn.functional as F

SHAPES = [(64, 6, 256, 64), (16, 12, 1024, 64)]


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} scaled_dot_product_attention(is_causal=True), bf16, "
          f"{torch.cuda.get_device_name()}, median of {args.repeats}")
    print(f"{'B,H,T,D':<22} {'fwd ms':>10} {'bwd ms':>10} {'fwd+bwd ms':>10} {'TFLOP/s':>12}")
    g = torch.Generator(device=dev).manual_seed(0)
    for (B, H, T, D) in SHAPES:
        def rnd():
            return (torch.rand(B, H, T, D, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        q, k, v = (rnd().requires_grad_(True) for _ in range(3))
        dout = rnd()
        with torch.no_grad():
            fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                            args.repeats)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def bwd_only():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        def both():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), dout)

        bwd = median_ms(bwd_only, args.repeats)
        fb = median_ms(both, args.repeats)
        flops = 3.5 * 4.0 * B * H * T * T * D / 2.0
        name = f"{B},{H},{T},{D}"
        print(f"{name:<22} {fwd:10.3f} {bwd:10.3f} {fb:10.3f} {flops / (fb * 1e-3) / 1e12:12.1f}")
        print(f"RESULT torch {name} {fwd:.4f} {bwd:.4f} {fb:.4f}")


if __name__ == "__main__":
    main()
