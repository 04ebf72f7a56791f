"""The out-of-distribution table for one math policy (docs/results/improve.md).

python examples/math_ood/table.py PLAIN VARIANT_EVAL [VARIANT_EVAL ...]

PLAIN is the policy's evaluation on the plain held-out split (a demo's
eval-rl.parquet, or a `ponder eval` directory); each VARIANT_EVAL a `ponder eval`
directory of the same policy with env.options.variant=ood|distractor|bait. A variant's
task `math-<variant>-0007` is the twin of `math-eval-0007`: the same problem and
answer, other text, so the two are paired by that number. Prints per split: correct,
its paired difference to plain with the standard error, lure_taken and format.
"""

from __future__ import annotations

import sys

from ponder.eval.gain import load_evaluation, paired_gain
from ponder.eval.metrics import mean
from ponder.types import Trajectory


def by_number(episodes: list[Trajectory]) -> dict[str, Trajectory]:
    """Episodes keyed by the number that ends their task id."""
    return {episode.task_id.rsplit("-", 1)[-1]: episode for episode in episodes}


def main(plain_path: str, variant_paths: list[str]) -> None:
    plain = by_number(load_evaluation(plain_path)[1])
    print("| split | correct | − plain (paired se) | lure taken | format |\n|---|---|---|---|---|")
    print(f"| plain | {mean([e.breakdown['correct'] for e in plain.values()]):.3f} | | | "
          f"{mean([e.breakdown['format'] for e in plain.values()]):.3f} |")  # fmt: skip
    for path in variant_paths:
        variant = by_number(load_evaluation(path)[1])
        if sorted(variant) != sorted(plain):
            raise SystemExit(f"{path}: its tasks are not the twins of {plain_path}'s")
        numbers = sorted(plain)
        gain = paired_gain([plain[n].breakdown["correct"] for n in numbers],
                           [variant[n].breakdown["correct"] for n in numbers])  # fmt: skip
        lure = [e.breakdown["lure_taken"] for e in variant.values() if "lure_taken" in e.breakdown]
        print(f"| {path} | {gain.after:.3f} | {gain.gain:+.3f} ({gain.se_paired:.3f}) | "
              f"{f'{mean(lure):.3f}' if lure else ''} | {mean([e.breakdown['format'] for e in variant.values()]):.3f} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
