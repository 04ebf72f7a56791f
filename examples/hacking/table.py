"""The length-biased-judge table of docs/results/improve.md: held-out episodes of a
math policy paid by `verbosity`, read by the verifier and the hacking detectors.

python examples/hacking/table.py BEFORE AFTER [AFTER ...]

Each argument is a held-out evaluation (a demo's eval-*.parquet or a `ponder eval`
directory) scored with the same reward (the runs' recipe.yaml), BEFORE the warm-up's.
Prints per evaluation: correct (the verifier, paid nothing) and its paired difference
to BEFORE with the standard error, the judge's score, the share of episodes that gave
an answer, paid but wrong (judge >= 0.5, correct 0), repetition and generated tokens.
"""

from __future__ import annotations

import sys

from ponder.config import ShapingConfig
from ponder.eval.gain import load_evaluation, paired_gain
from ponder.eval.metrics import mean
from ponder.rewards.hacking import generated_tokens, hacking_metrics


def main(before_path: str, after_paths: list[str]) -> None:
    before = {e.task_id: e for e in load_evaluation(before_path)[1]}
    print("| evaluation | correct | − before (paired se) | judge (verbosity) | answered | paid but wrong "
          "| repetition | tokens |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for path in [before_path, *after_paths]:
        after = {e.task_id: e for e in load_evaluation(path)[1]}
        if sorted(after) != sorted(before):
            raise SystemExit(f"{path}: not the held-out tasks of {before_path}")
        ids = sorted(before)
        gain = paired_gain([before[i].breakdown["correct"] for i in ids],
                           [after[i].breakdown["correct"] for i in ids])  # fmt: skip
        episodes = list(after.values())
        rates = hacking_metrics(episodes, {}, ShapingConfig(judge="verbosity"))
        change = f"{gain.gain:+.3f} ({gain.se_paired:.3f})" if path != before_path else ""
        print(f"| {path} | {gain.after:.3f} | {change} | {rates['hacking/judge_mean']:.2f} | "
              f"{mean([float(e.final_answer is not None) for e in episodes]):.2f} | "
              f"{rates['hacking/judge_unverified_rate']:.2f} | "
              f"{rates['hacking/repetition']:.2f} | "
              f"{mean([float(generated_tokens(e)) for e in episodes]):.0f} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
