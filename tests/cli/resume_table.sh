#!/usr/bin/env bash
# Walks the resume table of docs/resume.md for one model (gpt or cnn):
#  1. every option of the program (its --help and the long options in its source) has a row,
#     and every row names an option of the program;
#  2. a small checkpoint is trained with non-default settings; a resume with no options saves
#     the same config and model_config (the settings are restored);
#  3. each row's test arguments are given to a resume of that checkpoint: a "checked" row must
#     exit 2 with a message naming the option, "override" and "free" rows must exit 0.
# The data are made here (a small text; a Fashion-MNIST-shaped set, fashion_like.sh), so nothing
# is skipped.
# Usage: resume_table.sh NANOTRAIN DOC NANOTRAIN_SOURCE WORK_DIR gpt|cnn
set -u
nt=$1 doc=$2 src=$3 work=$4 model=$5
rm -rf "$work"
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# ---- 1. the table covers the program's options, and only those ----
"$nt" --help >"$work/help" 2>&1 || { echo "FAIL: --help exited non-zero"; exit 1; }
grep -o -- '--[a-z][a-z0-9-]*' "$work/help" | sed 's/^--//' | sort -u >"$work/opts_help"
{ grep -o '{"[a-z0-9-]*", *\(no\|required\|optional\)_argument' "$src" |
    sed 's/{"\([^"]*\)".*/\1/'; echo kernel-opt; } | sort -u >"$work/opts_src"
grep '^| `--' "$doc" | sed 's/^| `--\([a-z0-9-]*\)`.*/\1/' | sort >"$work/opts_doc_all"
sort -u "$work/opts_doc_all" >"$work/opts_doc"
[[ $(wc -l <"$work/opts_doc_all") -eq $(wc -l <"$work/opts_doc") ]] ||
  fail "an option has two rows in $doc"
[[ $(wc -l <"$work/opts_doc") -gt 40 ]] || fail "the table in $doc was not found"
for o in $(comm -23 "$work/opts_src" "$work/opts_help"); do fail "--$o is not in --help"; done
for o in $(sort -u "$work/opts_help" "$work/opts_src" | comm -23 - "$work/opts_doc"); do
  fail "--$o has no row in $doc's resume table: add it (checked, override, free or n/a)"
done
for o in $(sort -u "$work/opts_help" "$work/opts_src" | comm -13 - "$work/opts_doc"); do
  fail "$doc has a row for --$o, which the program does not accept"
done

# ---- data and the base checkpoint ----
mkdir -p "$work/data" "$work/other"
common=(--lr 0.002 --min-lr 0.0003 --weight-decay 0.05 --beta1 0.85 --beta2 0.95 --eps 1e-7
        --warmup-iters 2 --lr-decay-iters 50 --grad-clip 0.7 --seed 11 --dropout 0.05
        --growth-interval 20 --growth-factor 3 --backoff-factor 0.4 --init-scale 256
        --log-interval 5 --metrics-interval 5 --keep-checkpoints 2 --device cpu --quiet)
if [[ $model == gpt ]]; then
  for i in $(seq 300); do echo "the cat sat on the mat $i"; done >"$work/data/tinyshakespeare.txt"
  for i in $(seq 300); do echo "the mat sat on the cat $i"; done >"$work/other/tinyshakespeare.txt"
  base=(gpt "${common[@]}" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4
        --eval-interval 5 --eval-iters 2 --max-iters 5 --checkpoint-interval 5 --sample 0
        --num-workers 1)
  step=5 more=6
else
  for d in data other; do bash "$(dirname "$0")/fashion_like.sh" "$work/$d" 64 32; done
  base=(cnn "${common[@]}" --widths 4,8,16 --batch-size 16 --epochs 1 --max-iters 2
        --train-subset 64 --test-subset 32 --num-workers 2)
  step=2 more=3
fi
ctx=("$model" --device cpu --quiet --data-dir "$work/data")   # given to every resume
"$nt" "${base[@]}" --data-dir "$work/data" --out-dir "$work/run" >"$work/base.log" 2>&1 ||
  { cat "$work/base.log"; echo "FAIL: the base run"; exit 1; }
ckpt=$work/run/ckpt-$step
[[ -f $ckpt/ckpt.json ]] || { ls -R "$work/run"; echo "FAIL: no $ckpt"; exit 1; }

# ---- 2. restored: a resume with no settings saves the same settings ----
section() {   # file key: the flat JSON object after "key": (no nested objects but data's)
  tr -d '\n' <"$1" | grep -o "\"$2\":{[^}]*}" | head -1 | sed 's/"max_iters":[0-9]*,//'
}
"$nt" "${ctx[@]}" --max-iters $more --out-dir "$work/restored" --resume "$ckpt" \
  >"$work/restored.log" 2>&1 || { cat "$work/restored.log"; fail "the plain resume"; }
for key in config model_config; do
  a=$(section "$ckpt/ckpt.json" $key)
  b=$(section "$work/restored/ckpt-$more/ckpt.json" $key)
  [[ -n $a && "$a" == "$b" ]] || fail "resume did not restore $key: saved $a, resumed run saved $b"
done

# the GPT's data source is restored too: a synthetic run resumes as one without --data
if [[ $model == gpt ]]; then
  "$nt" gpt --device cpu --quiet --data synthetic --vocab-size 50 --n-layer 1 --n-head 2 \
    --n-embd 32 --block-size 16 --batch-size 4 --eval-interval 0 --max-iters 2 \
    --out-dir "$work/syn" >"$work/syn.log" 2>&1 || fail "the synthetic run"
  "$nt" "${ctx[@]}" --max-iters 3 --resume "$work/syn" >"$work/syn.log" 2>&1 ||
    { cat "$work/syn.log"; fail "a synthetic checkpoint resumed without --data"; }
  grep -q '"source":"synthetic"' "$work/syn/ckpt-3/ckpt.json" ||
    fail "the resumed run did not train on the checkpoint's synthetic data"
fi

# ---- 3. each row's rule ----
n_rows=0
while IFS='|' read -r _ opt rule gpt_args cnn_args _; do
  opt=$(echo "$opt" | tr -d ' `')
  rule=$(echo "$rule" | sed 's/^ *\**\([a-z/]*\).*/\1/')
  args=$([[ $model == gpt ]] && echo "$gpt_args" || echo "$cnn_args")
  args=$(echo "$args" | tr -d '`' | sed "s|@SCRATCH@|$work|g; s|@OTHER_DATA@|$work/other|g")
  [[ $args =~ ^\ *—\ *$ ]] && continue
  grep -qx -- "${opt#--}" "$work/opts_doc" || continue
  read -r -a argv <<<"$args"
  n_rows=$((n_rows + 1))
  out=$work/scratch_$n_rows
  "$nt" "${ctx[@]}" --out-dir "$out" "${argv[@]}" --resume "$ckpt" >"$work/row.log" 2>&1
  rc=$?
  case $rule in
  checked)
    if [[ $rc -ne 2 ]]; then
      fail "$opt ($args): exit status $rc, expected 2 (a conflict with the checkpoint)"
      tail -3 "$work/row.log"
    elif ! grep -q -- "$opt" "$work/row.log"; then
      fail "$opt ($args): exit 2 but the message does not name $opt"; tail -3 "$work/row.log"
    fi ;;
  override|free)
    if [[ $rc -ne 0 ]]; then
      fail "$opt ($args): exit status $rc, expected 0 ($rule)"; tail -3 "$work/row.log"
    fi ;;
  *) fail "$opt: rule '$rule' is not checked, override, free or n/a" ;;
  esac
  echo "$opt ($args): $rule, exit $rc $(grep -m1 "^nanotrain:" "$work/row.log" | cut -c1-160)"
done < <(grep '^| `--' "$doc")
[[ $n_rows -gt 15 ]] || fail "only $n_rows rows were tested"
[[ $failures -eq 0 ]] || { echo "$failures failure(s)"; exit 1; }
echo "resume table ($model): $n_rows rows as documented; the settings restored"
