#!/usr/bin/env bash
# Smoke test of bench/bench_dist_torch.py (bench/CMakeLists.txt registers it, label cpu): two
# CPU ranks (gloo) of `--device cpu --tiny --wrap ddp`, launched by torchrun (python3 -m
# torch.distributed.run, what the torchrun command runs) and, where mpirun is given and found,
# by mpirun (Open MPI's OMPI_COMM_WORLD_* variables mapped to RANK / WORLD_SIZE / LOCAL_RANK).
# Each run must exit 0 and rank 0's JSON must hold the fields gpu_multi.sh reads, consistent.
# Usage: bench_dist_torch_smoke.sh WORKDIR [MPIEXEC]
# Exit 77 (skipped) when python3 cannot import torch with torch.distributed and gloo, or when
# neither launcher is there.
set -u
work=$1 mpiexec=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
bench="$here/bench/bench_dist_torch.py"
py=$(command -v python3) || { echo "no python3: skipped"; exit 77; }
"$py" -c "import torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available()" \
  2>/dev/null || { echo "torch (with torch.distributed and gloo) not importable by $py: skipped"; exit 77; }
launchers=()
"$py" -c "import torch.distributed.run" 2>/dev/null && launchers+=(torchrun)
if [ -n "$mpiexec" ] && { [ -x "$mpiexec" ] || command -v "$mpiexec" >/dev/null; }; then
  launchers+=(mpirun)
fi
[ ${#launchers[@]} -gt 0 ] || { echo "neither torchrun nor mpirun: skipped"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
args=(--device cpu --tiny --wrap ddp --windows 3 --window 2 --skip 1)
fail=0
for l in "${launchers[@]}"; do
  json="$work/$l.json" log="$work/$l.log"
  rm -f "$json"
  if [ "$l" = torchrun ]; then
    timeout 240 "$py" -m torch.distributed.run --standalone --nproc_per_node 2 "$bench" \
      "${args[@]}" --json "$json" > "$log" 2>&1
  else
    # env:// rendezvous: every rank must be told the same free port
    port=$("$py" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    timeout 240 "$mpiexec" -np 2 --oversubscribe --bind-to none -x MASTER_ADDR=127.0.0.1 \
      -x MASTER_PORT="$port" "$py" "$bench" "${args[@]}" --json "$json" > "$log" 2>&1
  fi
  rc=$?
  if [ $rc != 0 ]; then
    echo "FAIL: $l: exit $rc"; tail -20 "$log"; fail=1; continue
  fi
  grep '^torch ddp' "$log"
  "$py" - "$json" "$l" <<'PY' || fail=1
import json, math, sys
r = json.load(open(sys.argv[1]))
want = {"wrap", "compile", "world_size", "launcher", "backend", "tokens_per_s", "step_ms_median",
        "step_ms_min", "step_ms_max", "windows_ms", "rank_windows_ms", "peak_mib", "loss", "config",
        "torch"}
missing = want - set(r)
checks = [
    (not missing, f"fields missing: {sorted(missing)}"),
    (r.get("wrap") == "ddp" and r.get("compile") is False, "wrap/compile"),
    (r.get("world_size") == 2 and r.get("backend") == "gloo", "world_size 2 over gloo"),
    (r.get("launcher") == sys.argv[2], f"launcher {r.get('launcher')} (want {sys.argv[2]})"),
    (r.get("tokens_per_s", 0) > 0, "tokens/s > 0"),
    (r.get("step_ms_min", 1) <= r.get("step_ms_median", 0) <= r.get("step_ms_max", -1),
     "step ms min <= median <= max"),
    (len(r.get("windows_ms", [])) == 3 and len(r.get("rank_windows_ms", [])) == 2, "3 windows, 2 ranks"),
    (len(r.get("peak_mib", [])) == 2, "a peak per rank (null on the CPU)"),
    (all(math.isfinite(x) for x in r.get("loss", [math.nan])), "finite losses"),
    (abs(r.get("tokens_per_s", 0) * r.get("step_ms_median", 0) / 1e3 -
         2 * r["config"]["batch_per_rank"] * r["config"]["block_size"]) < 1e-6 * 2 ** 20
     if "config" in r else False, "tokens/s = world x batch x block / median step"),
]
bad = [m for ok, m in checks if not ok]
for m in bad:
    print(f"FAIL: {sys.argv[2]}: {m}")
sys.exit(1 if bad else 0)
PY
done
[ $fail = 0 ] && echo "bench_dist_torch smoke: OK (${launchers[*]})"
exit $fail
