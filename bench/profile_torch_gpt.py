"""Where PyTorch's GPT step spends its GPU time (torch.profiler, kernel table), for the same
model, batch and dtype as bench_train.py's gpt2 row: the reference for profile_kernels.py.
Usage: python3 bench/profile_torch_gpt.py [--compile] [--preset gpt2|char]"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import GPT, adamw, gpt_step  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--preset", default="gpt2")
    a = ap.parse_args()
    L, H, C, T, V, p, B = ((12, 12, 768, 1024, 50304, 0.0, 16) if a.preset == "gpt2"
                           else (6, 6, 384, 256, 65, 0.2, 64))
    torch.manual_seed(0)
    model = GPT(L, H, C, T, V, p).cuda()
    opt = adamw(model, 1e-3, (0.9, 0.99), 0.1)
    fwd = torch.compile(model) if a.compile else model
    x = torch.randint(V, (B, T), device="cuda")
    y = torch.randint(V, (B, T), device="cuda")

    def step():
        gpt_step(model, fwd, opt, x, y)

    for _ in range(8):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90))


if __name__ == "__main__":
    main()
