#!/usr/bin/env bash
# The main job: trains the CNN on Fashion-MNIST and the GPT on a text corpus with
# build/nanotrain, on the GPU when there is one (the full configs: CNN 10 epochs fp16 + loss
# scaler, GPT nanoGPT shakespeare_char 5000 iterations bf16) and with smaller settings on the
# CPU (a few minutes on 2 cores), then prints where the logs and checkpoints are.
#   scripts/main_job.sh                 # auto: GPU if present
#   NT_DEVICE=cpu scripts/main_job.sh   # force the CPU settings
#   BUILD=build-x OUT=runs/mine scripts/main_job.sh
# Tiny shakespeare: $NT_DATA_DIR/tinyshakespeare.txt, else .data/tinyshakespeare.txt (the GPT
# part is skipped with a message when neither exists). The file is identified by its MD5: the
# headings and the summary name the corpus the GPT actually trained on (tiny shakespeare, or
# scripts/get_data.sh's fallback corpus, or an unknown text).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-runs/$(date +%Y%m%d-%H%M%S)}
TRAIN="$BUILD/nanotrain"

if [[ ! -x "$TRAIN" ]]; then
  echo "== building $TRAIN"
  cmake -S . -B "$BUILD" -G Ninja >/dev/null
  ninja -C "$BUILD" nanotrain
fi

device=${NT_DEVICE:-auto}
if [[ "$device" == auto ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    device=cuda
  else
    device=cpu
  fi
fi

if [[ -z "${NT_DATA_DIR:-}" && -f .data/tinyshakespeare.txt ]]; then
  export NT_DATA_DIR="$PWD/.data"
fi

mkdir -p "$OUT/cnn" "$OUT/gpt"
echo "== main job on $device; output in $OUT"

if [[ "$device" == cuda ]]; then
  cnn_args=(--device cuda --dtype fp16 --epochs 10)
  gpt_args=(--device cuda --dtype bf16)
else
  # CPU: narrow CNN on a 10k subset, tiny GPT; the same code paths, minutes instead of hours
  cnn_args=(--device cpu --dtype fp32 --widths 4,8,128 --epochs 2 --train-subset 10000
            --test-subset 2000 --batch-size 32 --lr 2e-3 --num-workers 2)
  gpt_args=(--device cpu --dtype fp32 --n-layer 2 --n-head 4 --n-embd 64 --block-size 64
            --batch-size 16 --max-iters 300 --lr-decay-iters 300 --warmup-iters 20 --lr 3e-3
            --min-lr 3e-4 --dropout 0 --eval-interval 100 --eval-iters 20 --log-interval 50)
fi

status=0
echo "== CNN on Fashion-MNIST"
if ! "$TRAIN" cnn "${cnn_args[@]}" --out-dir "$OUT/cnn" 2>&1 | tee "$OUT/cnn/train.log"; then
  echo "!! the CNN run failed (see $OUT/cnn/train.log)"
  status=1
fi

# Which corpus the file is (never call another text "tiny shakespeare").
corpus="none"
if [[ -n "${NT_DATA_DIR:-}" && -f "$NT_DATA_DIR/tinyshakespeare.txt" ]]; then
  md5=$(md5sum < "$NT_DATA_DIR/tinyshakespeare.txt" | cut -d' ' -f1)
  if [[ "$md5" == 6fb458f1232090904fb40fe944165e91 ]]; then
    corpus="tiny shakespeare"
  elif [[ "$NT_DATA_DIR" == */fallback ]]; then
    corpus="a FALLBACK corpus (the system's license texts, not tiny shakespeare)"
  else
    corpus="an unknown text (not tiny shakespeare: MD5 $md5)"
  fi
fi
echo "== GPT on $corpus"
if [[ "$corpus" != none ]]; then
  echo "corpus: $corpus, $NT_DATA_DIR/tinyshakespeare.txt" > "$OUT/gpt/corpus.txt"
  if ! "$TRAIN" gpt "${gpt_args[@]}" --out-dir "$OUT/gpt" --sample 300 2>&1 |
      tee "$OUT/gpt/train.log"; then
    echo "!! the GPT run failed (see $OUT/gpt/train.log)"
    status=1
  fi
else
  echo "!! skipped: set NT_DATA_DIR to the folder holding tinyshakespeare.txt (or put it in .data/)"
fi

echo
echo "== where things are"
for m in cnn gpt; do
  if [[ -f "$OUT/$m/latest" ]]; then
    echo "  $m: log $OUT/$m/train.log, metrics $OUT/$m/metrics.jsonl (JSONL) and"
    echo "       $OUT/$m/metrics.prom (Prometheus textfile), checkpoint $OUT/$m/$(cat "$OUT/$m/latest")/"
  fi
done
[[ "$corpus" != none ]] && echo "  the GPT trained on $corpus"
exit $status
