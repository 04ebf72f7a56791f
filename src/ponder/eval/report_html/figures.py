"""Learning curves for the HTML report: matplotlib figures inlined as base64 PNG, so
the page needs no network and no file next to it. With a second run, its curves are
drawn dashed on the same axes (same colour per key)."""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI machines

import matplotlib.pyplot as plt  # noqa: E402

# (panel title, y label, key prefixes or keys drawn together). A key ending in "/"
# takes every key under it. Panels none of whose keys were logged are left out.
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "mean episode reward", ("reward/mean",)),
    ("reward components", "mean per episode", ("reward/",)),
    ("entropy", "nats per token", ("policy/entropy",)),
    ("KL", "to the reference / old policy", ("policy/kl", "policy/approx_kl")),
    ("lengths", "tokens per episode", ("episode/response_tokens", "episode/generated_tokens")),
    ("turns and tool use", "per episode", ("episode/turns", "episode/searches")),
    ("held-out / validation", "reward", ("eval/reward", "val/reward")),
    ("reward hacking", "share of episodes", ("hacking/answer_guessing", "hacking/answer_hedging",
                                             "hacking/format_gaming",
                                             "hacking/repetition", "hacking/truncation_rate",
                                             "hacking/judge_unverified_rate", "hacking/repeated_call")),
    ("hacking trends", "correlation / flag", ("hacking/length_reward_corr", "hacking/length_gaming",
                                              "hacking/judge_exploitation")),
    ("loss", "loss", ("loss/policy", "loss/value", "sft/loss", "sft/eval_loss", "dpo/loss")),
    ("gradient norm", "before clipping", ("optim/grad_norm", "sft/grad_norm", "dpo/grad_norm")),
)
EXCLUDED = ("reward/mean", "reward/std")  # drawn in their own panel
# search_cost counts searches: on a reward axis it squashes every other component.
COUNT_COMPONENTS = ("reward/search_cost",)
DPI = 90
COLOURS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def curve_figures(sources: list[tuple[str, list[dict[str, Any]]]], linestyles: tuple[str, ...] = ("-", "--"),
                  ) -> list[dict[str, str]]:  # fmt: skip
    """One PNG per panel that has data: [{"title", "png" (base64)}]. `sources`: one
    (label, metrics records) per run; labels show in the legend when there are two."""
    figures = []
    for title, ylabel, wanted in PANELS:
        keys = _keys([records for _, records in sources], wanted)
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(4.4, 2.8), dpi=DPI)
        for (label, records), style in zip(sources, linestyles):
            for colour, key in zip(COLOURS * 4, keys):
                steps, values = _series(records, key)
                if steps:
                    name = key if len(sources) == 1 else f"{key} ({label})"
                    marker = "o" if len(steps) < 30 else None
                    ax.plot(steps, values, linestyle=style, color=colour, marker=marker, markersize=3, label=name)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
        fig.tight_layout()
        figures.append({"title": title, "png": _png(fig)})
    return figures


def _keys(runs: list[list[dict[str, Any]]], wanted: tuple[str, ...]) -> list[str]:
    present = sorted({key for records in runs for record in records for key in record})
    keys: list[str] = []
    for item in wanted:
        if item.endswith("/"):
            keys += [k for k in present if k.startswith(item) and k not in EXCLUDED and k not in COUNT_COMPONENTS]
        elif item in present:
            keys.append(item)
    return [key for key in dict.fromkeys(keys) if any(_series(records, key)[0] for records in runs)]


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`, leaving out steps where it is absent or not finite."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def _png(fig: plt.Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
