"""Pictures of the benchmark results (docs/results/benchmarks.md):

- tokens/s vs generation batch size, measured against the roofline (bench/roofline.py);
- the GRPO step's time split, ponder vs TRL, per workload (bench/grpo_vs_trl.py).

    .venv/bin/python bench/plots.py --roofline runs/bench/roofline.json \
        --grpo runs/bench/grpo_vs_trl.json --out docs/results/img
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = (("generation_s", "generation"), ("logprob_s", "logprob recomputation"), ("update_s", "update"),
          ("other_s", "other"))  # fmt: skip


def load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{path}: cannot read benchmark results ({exc}); run `make bench` first")


def plot_roofline(result: dict[str, Any], out: Path) -> Path:
    """Measured generation tokens/s and the roofline bound at each batch size."""
    rows = sorted(result["generation"], key=lambda r: r["batch"])
    batches = [r["batch"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(batches, [r["roofline_tokens_per_s"] for r in rows], "--", color="grey", label="roofline (min of compute, bandwidth)")
    ax.plot(batches, [r["tokens_per_s"] for r in rows], "o-", label="ponder hf backend (measured)")
    for r in rows:
        ax.annotate(f"{100 * r['fraction_of_roofline']:.0f}%", (r["batch"], r["tokens_per_s"]),
                    textcoords="offset points", xytext=(6, -12))  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("generation batch size")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"{result['model']}, fp32, {result['threads']} threads")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out / "bench-roofline.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def median_phases(steps: list[dict[str, float]]) -> list[float]:
    return [statistics.median(s[key] for s in steps) for key, _ in PHASES]


def plot_step_split(result: dict[str, Any], out: Path) -> Path:
    """Stacked median step time by phase, ponder and TRL side by side per workload."""
    bars: list[tuple[str, list[float]]] = []
    for workload, record in result["workloads"].items():
        for system in ("ponder", "trl"):
            bars.append((f"{workload}\n{'TRL' if system == 'trl' else system}", median_phases(record["runs"][system]["steps"])))
    fig, ax = plt.subplots(figsize=(6, 4))
    bottoms = [0.0] * len(bars)
    for i, (_, label) in enumerate(PHASES):
        heights = [phases[i] for _, phases in bars]
        ax.bar([name for name, _ in bars], heights, bottom=bottoms, label=label)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for x, total in enumerate(bottoms):
        ax.annotate(f"{total:.1f} s", (x, total), ha="center", textcoords="offset points", xytext=(0, 3))
    ax.set_ylabel("median step time (s)")
    ax.set_title("GRPO step: ponder vs TRL GRPOTrainer")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "bench-step-split.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roofline", type=Path, default=Path("runs/bench/roofline.json"))
    parser.add_argument("--grpo", type=Path, default=Path("runs/bench/grpo_vs_trl.json"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench"), help="folder for the PNGs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (plot_roofline(load(args.roofline), args.out), plot_step_split(load(args.grpo), args.out)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
