#!/usr/bin/env bash
# Evaluate the three source runs and every merge of them on each task's held-out
# evaluation (docs/results-personal.md, "Model merging"). Greedy decoding, one episode
# per task (ponder eval's default), the recipe's own eval seed, EPISODES held-out tasks
# per task. Usage, from the repo root:
#   EPISODES=64 examples/merge/evaluate.sh [METHOD ...]   (default: sources + all methods)
set -u
EPISODES=${EPISODES:-64}
OUT=${OUT:-/tmp/ponder-merge}
declare -A RECIPE=([math]=runs/math-grpo-s0/recipe.yaml [fc]=runs/fc-s0/recipe.yaml
                   [qa]=runs/i23/p-s0/recipe.yaml)
declare -A SOURCE=([math]=runs/math-grpo-s0 [fc]=runs/fc-s0 [qa]=runs/i23/p-s0)
evaluate() {  # model task out
  local start=$SECONDS
  ponder eval --recipe "${RECIPE[$2]}" --model "$1" --episodes "$EPISODES" --out "$3" --overwrite \
    eval.temperature=0 > "$3.log" 2>&1
  echo "$(date +%T) eval $1 on $2: rc=$? $((SECONDS - start))s" >> "$OUT/progress.log"
}
mkdir -p "$OUT"
for item in "${@:-sources task_arithmetic ties dare_ties linear dare_linear}"; do
  for what in $item; do
    if [ "$what" = sources ]; then
      for task in math fc qa; do evaluate "${SOURCE[$task]}" "$task" "$OUT/eval-source-$task"; done
      continue
    fi
    [ -f "$OUT/$what/ponder.json" ] || ponder merge "examples/merge/$what.yaml" "out=$OUT/$what" \
      >> "$OUT/progress.log" 2>&1
    for task in math fc qa; do evaluate "$OUT/$what" "$task" "$OUT/eval-$what-$task"; done
  done
done
