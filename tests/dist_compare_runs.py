"""Compares two nanotrain runs: the training losses of metrics.jsonl (step by step) and every
tensor of the newest checkpoint (parameters and AdamW moments; a sharded checkpoint is first
consolidated from its per-rank files by the ranges in its manifest), within a relative tolerance.
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


def checkpoint_dir(run):
    """The newest checkpoint's directory: RUN/latest names the ckpt-<step> directory (a file
    holding its name, or a link); RUN itself otherwise."""
    import os
    latest = os.path.join(run, "latest")
    if os.path.isfile(latest) and not os.path.islink(latest):
        return os.path.join(run, open(latest).read().strip())
    if os.path.isdir(latest):
        return latest
    return run


def read_safetensors(path):
    blob = open(path, "rb").read()
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


def consolidate(d, layout):
    """A sharded checkpoint's whole tensors, named as a consolidated one's: every unit's flat
    buffer assembled from the ranks' ranges, then cut into its parameters."""
    shards = [read_safetensors(d + "/" + f) for f in layout["files"]]
    out = {}
    for unit in layout["units"]:
        flat = {}
        for kind in layout["tensors"]:
            buf = np.zeros(unit["numel"], dtype=np.float32)
            for r, (lo, hi) in enumerate(unit["ranges"]):
                if hi > lo:
                    part = shards[r][kind + "." + unit["name"]]
                    if part.size != hi - lo:
                        raise SystemExit(f"FAIL: rank {r}'s {kind} of {unit['name']} has "
                                         f"{part.size} elements, its range {hi - lo}")
                    buf[lo:hi] = part
            flat[kind] = buf
        for p in unit["params"]:
            n = int(np.prod(p["shape"])) if p["shape"] else 1
            out[p["name"]] = flat["master"][p["offset"]:p["offset"] + n]
        out["optimizer." + unit["name"] + ".exp_avg"] = flat["exp_avg"]
        out["optimizer." + unit["name"] + ".exp_avg_sq"] = flat["exp_avg_sq"]
    return out


def tensors(run):
    """The newest checkpoint's tensors (consolidated from its shards when it is sharded)."""
    import os
    d = checkpoint_dir(run)
    if os.path.isfile(d + "/ckpt.safetensors"):
        return read_safetensors(d + "/ckpt.safetensors")
    manifest = json.load(open(d + "/MANIFEST.json"))
    if "sharded" not in manifest:
        raise SystemExit(f"FAIL: {d} has neither ckpt.safetensors nor shards")
    return consolidate(d, manifest["sharded"])


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


if __name__ == "__main__":
    main()
