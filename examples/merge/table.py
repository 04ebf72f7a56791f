"""The merge table: each model's score on each task, and as a fraction of the source's.

python examples/merge/table.py [/tmp/ponder-merge]   (after examples/merge/evaluate.sh)
With the shared warm-up's evaluations (eval-warmup-TASK), a second table: the share of
each source's change over the warm-up that each merge keeps.
Scores: math `correct`, function calling `bfcl`, search-QA `em` (the tasks' success
components), mean over the evaluated tasks ± standard error.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pyarrow.parquet as pq

TASKS = {"math": "correct", "fc": "bfcl", "qa": "em"}
NAMES = {"math": "math", "fc": "function calling", "qa": "search-QA"}


def per_task(directory: Path, component: str) -> dict[str, float] | None:
    file = directory / "trajectories.parquet"
    if not file.is_file():
        return None
    table = pq.read_table(file, columns=["task_id", "breakdown"])
    rows = zip(table.column("task_id").to_pylist(), table.column("breakdown").to_pylist())
    return {task: (b if isinstance(b, dict) else {d["key"]: d["value"] for d in b})[component] for task, b in rows}


def score(directory: Path, component: str, only: set[str] | None = None) -> tuple[float, float, int] | None:
    """Mean ± se over the evaluated tasks (`only`: the same tasks as another evaluation)."""
    found = per_task(directory, component)
    if found is None:
        return None
    values = [v for task, v in found.items() if only is None or task in only]
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else 0.0
    return mean, se, n


def main(root: Path) -> None:
    sources = {task: score(root / f"eval-source-{task}", comp) for task, comp in TASKS.items()}
    header = "| model | " + " | ".join(f"{NAMES[t]}: score (fraction of source)" for t in TASKS) + " | min fraction |"
    print(header)
    print("|" + " --- |" * (len(TASKS) + 2))
    print("| source adapter (own task) | " + " | ".join(
        f"{s[0]:.3f} ± {s[1]:.3f} (n={s[2]})" if s else "—" for s in sources.values()) + " | 1.00 |")  # fmt: skip
    methods = sorted({p.name.split("-")[1] for p in root.glob("eval-*-*") if p.is_dir() and "source" not in p.name})
    for method in methods:
        cells, fractions = [], []
        for task, comp in TASKS.items():
            merged = per_task(root / f"eval-{method}-{task}", comp)
            got = score(root / f"eval-{method}-{task}", comp)
            # The source on the same held-out tasks (a merge evaluated on fewer episodes
            # ran the first N of the same list).
            base = score(root / f"eval-source-{task}", comp, set(merged)) if merged else None
            if got is None or base is None or base[0] == 0:
                cells.append("—")
                continue
            fractions.append(got[0] / base[0])
            cells.append(f"{got[0]:.3f} ± {got[1]:.3f} vs {base[0]:.3f} (n={got[2]}): {fractions[-1]:.2f}")
        low = f"{min(fractions):.2f}" if len(fractions) == len(TASKS) else "—"
        print(f"| {method} | " + " | ".join(cells) + f" | {low} |")


def gain_kept(root: Path) -> None:
    """With a shared warm-up (eval-warmup-TASK): the share of each source's change over
    the warm-up (source − warm-up, what RL did) that each merge keeps, on the same tasks."""
    if not all((root / f"eval-warmup-{task}").is_dir() for task in TASKS):
        return
    columns = " | ".join(f"{NAMES[t]}: (merge − warm-up) / (source − warm-up)" for t in TASKS)
    print(f"\n| model | {columns} |")
    print("|" + " --- |" * (len(TASKS) + 1))
    methods = sorted({p.name.split("-")[1] for p in root.glob("eval-*-*") if p.is_dir()})
    methods = [m for m in methods if m not in ("source", "warmup")]
    for method in methods:
        cells = []
        for task, comp in TASKS.items():
            merged = per_task(root / f"eval-{method}-{task}", comp)
            if merged is None:
                cells.append("—")
                continue
            got, source, warm = (score(root / f"eval-{name}-{task}", comp, set(merged))
                                 for name in (method, "source", "warmup"))  # fmt: skip
            change = source[0] - warm[0]
            kept = f"{(got[0] - warm[0]) / change:.2f}" if change else "no change"
            cells.append(f"{got[0] - warm[0]:+.3f} of {change:+.3f}: {kept}")
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ponder-merge")
    main(root)
    gain_kept(root)
