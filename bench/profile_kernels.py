"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name: where a step's GPU
time goes. Usage: python3 bench/profile_kernels.py ncu.csv [iterations]"""
import csv
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]   # ncu prints its own ==PROF== lines too
    total = defaultdict(float)
    count = defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0][:90]
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(row["Metric Unit"], 1.0)
        total[name] += float(row["Metric Value"].replace(",", "")) * scale
        count[name] += 1
    all_us = sum(total.values())
    print(f"{'kernel':90s} {'calls/it':>8s} {'us/it':>9s} {'%':>6s}")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{name:90s} {count[name] / iters:8.1f} {us / iters:9.1f} {100 * us / all_us:6.2f}")
    print(f"{'total':90s} {sum(count.values()) / iters:8.1f} {all_us / iters:9.1f}")


if __name__ == "__main__":
    main()
