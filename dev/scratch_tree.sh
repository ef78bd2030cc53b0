# Sourced by the experiment scripts under dev/ (from the repository root, `. dev/scratch_tree.sh
# DIR`): sets out ($OUT, made if missing), here (the repository) and NT_DATA_DIR (default
# here/.data), puts the CUDA toolkit on PATH, and moves into DIR, a fresh copy of the working
# tree without data, builds or git, so that patches applied there never touch this tree.
# Defines losses FILE (a run's training losses from its metrics.jsonl, one line) and med FILE
# (the median step time of its log windows after the first two, with their range).
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
out=${OUT:-/tmp/nt-out}
mkdir -p "$out"
here=$PWD
export NT_DATA_DIR=${NT_DATA_DIR:-$here/.data}
rm -rf "$1" && mkdir -p "$1"
tar --exclude=./.data --exclude='./build*' --exclude=./runs --exclude=./.git -cf - . | tar -xf - -C "$1"
cd "$1"
losses() {  # nothing when the run left no metrics
  [[ -s $1 ]] && python3 -c "import json,sys; print(' '.join(repr(r['loss']) for r in map(json.loads, open(sys.argv[1])) if 'loss' in r and r.get('kind', 'train') == 'train'))" "$1"
}
med() {
  [[ -s $1 ]] || { echo "no metrics (the run failed)"; return; }
  python3 - "$1" <<'PY'
import json, statistics, sys
ms = [r["step_ms"] for r in map(json.loads, open(sys.argv[1])) if r.get("step_ms") is not None][2:]
print("%.3f ms [%.3f-%.3f] n=%d" % (statistics.median(ms), min(ms), max(ms), len(ms)) if ms else "none")
PY
}
