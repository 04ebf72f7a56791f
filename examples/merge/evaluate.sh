#!/usr/bin/env bash
# Evaluate the three source runs and every merge of them on each task's held-out
# evaluation (docs/results/personal.md, "Model merging"). Greedy decoding, one episode
# per task (ponder eval's default), each source's own recipe and eval seed, EPISODES
# held-out tasks per task. Usage, from the repo root:
#   EPISODES=64 examples/merge/evaluate.sh [METHOD ...]   (default: sources + all methods)
# The sources (each a run directory with its recipe.yaml) and the merge's base:
#   MATH_RUN, FC_RUN, QA_RUN   (default: the three runs each trained from the raw base)
#   BASE                       (default smollm2-135m; a shared warm-up, `ponder warmup`'s
#                               OUT/sft, makes the task vectors what RL changed)
#   WARMUP                     the shared warm-up, evaluated as the row "warmup" (METHOD warmup)
set -u
EPISODES=${EPISODES:-64}
OUT=${OUT:-/tmp/ponder-merge}
BASE=${BASE:-smollm2-135m}
declare -A SOURCE=([math]=${MATH_RUN:-runs/math-grpo-s0} [fc]=${FC_RUN:-runs/fc-s0} [qa]=${QA_RUN:-runs/i23/p-s0})
evaluate() {  # model task out
  local start=$SECONDS
  ponder eval --recipe "${SOURCE[$2]}/recipe.yaml" --model "$1" --episodes "$EPISODES" --out "$3" --overwrite \
    eval.temperature=0 > "$3.log" 2>&1
  echo "$(date +%T) eval $1 on $2: rc=$? $((SECONDS - start))s" >> "$OUT/progress.log"
}
mkdir -p "$OUT"
for item in "${@:-sources task_arithmetic ties dare_ties linear dare_linear}"; do
  for what in $item; do
    if [ "$what" = sources ] || [ "$what" = warmup ]; then
      for task in math fc qa; do
        model=${SOURCE[$task]}; [ "$what" = warmup ] && model=${WARMUP:?WARMUP names the shared warm-up}
        evaluate "$model" "$task" "$OUT/eval-${what%s}-$task"
      done
      continue
    fi
    [ -f "$OUT/$what/ponder.json" ] || ponder merge "examples/merge/$what.yaml" "out=$OUT/$what" \
      "base_model=$BASE" "models=[{model: ${SOURCE[math]}}, {model: ${SOURCE[fc]}}, {model: ${SOURCE[qa]}}]" \
      >> "$OUT/progress.log" 2>&1
    for task in math fc qa; do evaluate "$OUT/$what" "$task" "$OUT/eval-$what-$task"; done
  done
done
