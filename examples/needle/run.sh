#!/usr/bin/env bash
# Needle-in-a-haystack runs for docs/results/personal.md, "Long context", on the
# embedded model (trained context 8192 tokens). The slice measured on a shared 2-core
# CPU; FULL=1 runs the full grid the issue asks for (1x, 2x, 4x the trained length,
# five depths, every RoPE method at factor 4, before and after a 20-step fine-tune at
# 2x), which needs a GPU or many CPU hours. Usage, from the repo root:
#   examples/needle/run.sh            OUT=/tmp/ponder-needle by default
set -u
OUT=${OUT:-/tmp/ponder-needle}
mkdir -p "$OUT"
run() {  # name, then ponder needle arguments
  local name=$1 start=$SECONDS
  shift
  ponder needle --device cpu --out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$(date +%T) $name rc=$? $((SECONDS - start))s" >> "$OUT/progress.log"
}
if [ "${FULL:-0}" = 1 ]; then
  for rope in none linear dynamic yarn; do
    factor=4; [ $rope = none ] && factor=1
    run "full-$rope" --rope $rope --factor $factor --lengths 1x,2x,4x --depths 0,25,50,75,100 \
      --finetune-steps 20 --finetune-length 2x
  done
  exit 0
fi
# Below the trained length (dynamic NTK is the unscaled model there, by construction).
run short-none --rope none --lengths 512,1024 --depths 0,50,100
run short-linear --rope linear --factor 4 --lengths 512,1024 --depths 0,50,100
run short-yarn --rope yarn --factor 4 --lengths 512 --depths 0,50,100  # 1024: finetune-yarn's "before"
# A short fine-tune with YaRN x4, measured before and after.
run "finetune-yarn" --rope yarn --factor 4 --lengths 1024 --depths 0,50,100 \
  --finetune-steps 3 --finetune-length 1024 --finetune-lr 2e-4
# One cell at the trained length.
run "trained-none" --rope none --lengths 1x --depths 50
