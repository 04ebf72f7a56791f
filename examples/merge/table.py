"""The merge table: each model's score on each task, and as a fraction of the source's.

python examples/merge/table.py [/tmp/ponder-merge]   (after examples/merge/evaluate.sh)
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


def score(directory: Path, component: str) -> tuple[float, float, int] | None:
    file = directory / "trajectories.parquet"
    if not file.is_file():
        return None
    rows = pq.read_table(file, columns=["breakdown"]).column("breakdown").to_pylist()
    values = [dict(b)[component] if isinstance(b, dict) else {d["key"]: d["value"] for d in b}[component] for b in rows]
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
            got, base = score(root / f"eval-{method}-{task}", comp), sources[task]
            if got is None or base is None or base[0] == 0:
                cells.append("—")
                continue
            fractions.append(got[0] / base[0])
            cells.append(f"{got[0]:.3f} ± {got[1]:.3f} ({fractions[-1]:.2f})")
        low = f"{min(fractions):.2f}" if len(fractions) == len(TASKS) else "—"
        print(f"| {method} | " + " | ".join(cells) + f" | {low} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ponder-merge"))
