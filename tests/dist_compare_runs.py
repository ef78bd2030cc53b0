"""Compares two nanotrain runs: the training losses of metrics.jsonl (step by step) and every
tensor of the newest checkpoint (parameters and AdamW moments), within a relative tolerance.
Usage: dist_compare_runs.py RUN_DIR REFERENCE_DIR [--rtol X] [--first-step N] [--losses-only]
  --first-step N: compare the losses from step N on (a resumed run logs only those).
  --losses-only: not the checkpoints (a run that stopped before the reference did).
Exit 77 when numpy is missing (skipped), 1 on a difference."""
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy not installed: skipped")
    sys.exit(77)


def losses(run):
    out = {}
    with open(run + "/metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "train":
                out[rec["step"]] = rec["loss"]   # a resumed run may repeat steps: keep the last
    return out


def checkpoint_file(run):
    """The newest checkpoint's tensors: RUN/latest names the ckpt-<step> directory (a file
    holding its name, or a link); a flat RUN/ckpt.safetensors otherwise."""
    import os
    latest = os.path.join(run, "latest")
    if os.path.isfile(latest) and not os.path.islink(latest):
        name = open(latest).read().strip()
        return os.path.join(run, name, "ckpt.safetensors")
    if os.path.isdir(latest):
        return os.path.join(latest, "ckpt.safetensors")
    return os.path.join(run, "ckpt.safetensors")


def tensors(run):
    blob = open(checkpoint_file(run), "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"FAIL: {name} is {info['dtype']}, expected F32")
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + a:8 + n + b], dtype=np.float32)
    return out


def main():
    args = sys.argv[1:]
    rtol, first = 1e-5, 0
    losses_only = "--losses-only" in args
    if losses_only:
        args.remove("--losses-only")
    if "--rtol" in args:
        i = args.index("--rtol")
        rtol = float(args[i + 1])
        del args[i:i + 2]
    if "--first-step" in args:
        i = args.index("--first-step")
        first = int(args[i + 1])
        del args[i:i + 2]
    run, ref = args
    bad = 0
    got, want = losses(run), losses(ref)
    steps = sorted(s for s in got if s >= first)
    if not steps:
        raise SystemExit("FAIL: no training losses in " + run)
    for s in steps:
        if s not in want:
            raise SystemExit(f"FAIL: step {s} missing from the reference")
        if abs(got[s] - want[s]) > rtol * abs(want[s]) + 1e-7:
            print(f"loss at step {s}: {got[s]!r} vs {want[s]!r}")
            bad += 1
    print(f"{len(steps)} losses compared (steps {steps[0]}..{steps[-1]}), final "
          f"{got[steps[-1]]:.7f} vs {want[steps[-1]]:.7f}")
    if losses_only:
        if bad:
            raise SystemExit(f"FAIL: {bad} losses differ (rtol {rtol})")
        print("OK")
        return
    tg, tw = tensors(run), tensors(ref)
    if sorted(tg) != sorted(tw):
        raise SystemExit(f"FAIL: tensor names differ: {sorted(set(tg) ^ set(tw))}")
    worst = 0.0
    for name in tg:
        a, b = tg[name], tw[name]
        if a.shape != b.shape:
            raise SystemExit(f"FAIL: {name}: {a.shape} vs {b.shape}")
        # entries whose gradient is zero in exact arithmetic (attention's key bias) carry only
        # rounding noise: the floor is rtol relative to the tensor's largest entry
        tol = rtol * np.abs(b) + rtol * (np.abs(b).max() + 1e-30)
        diff = np.abs(a.astype(np.float64) - b)
        worst = max(worst, float((diff / (np.abs(b) + 1e-12)).max()) if diff.size else 0.0)
        if (diff > tol).any():
            print(f"{name}: {int((diff > tol).sum())} of {diff.size} differ, max abs "
                  f"{float(diff.max()):.3g}")
            bad += 1
    print(f"{len(tg)} tensors compared (largest relative difference {worst:.3g})")
    if bad:
        raise SystemExit(f"FAIL: {bad} differences (rtol {rtol})")
    print("OK")


main()
