"""What simulate.py reports: a progress line per measurement, the summary (each user's
rate against their interactions; the other users' and the base's rates across each
update; the base hash; the general evaluation), a markdown table, the JSON and a plot.

A point of the history (simulate.py's Simulation.point): round, trained (the user whose
update preceded it; None at the start), interactions (per user, so far), scores[model]
[checker] = {rate, se, n} where model is "base" or a user (that user's current model),
and, after an update, feedback, update (its metrics), pairs, other_adapters_unchanged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def fmt(score: dict[str, float]) -> str:
    return f"{score['rate']:.2f} ± {score['se']:.2f}"


def own(point: dict[str, Any], user: str) -> dict[str, float]:
    return point["scores"][user][user]


def delta(previous: dict[str, Any], point: dict[str, Any], user: str) -> float:
    return own(point, user)["rate"] - own(previous, user)["rate"]


def point_line(point: dict[str, Any], users: list[str]) -> str:
    rates = " · ".join(f"{user} {fmt(own(point, user))}" for user in users)
    if point["trained"] is None:
        return f"start (base for everyone) · {rates}"
    user, update = point["trained"], point.get("update", {})
    trained = (f"margin {update['margin_first']:.2f} → {update['margin_last']:.2f}" if "margin_last" in update
               else update.get("skipped", ""))  # fmt: skip
    return (f"round {point['round']} · {user}: {point['interactions'][user]} interactions, "
            f"{point['feedback'].get('rewrite', 0)} rewrites this round, {point['pairs']} pairs, {trained}, "
            f"{point['round_seconds']:.0f} s · {rates}")  # fmt: skip


def within_se(before: dict[str, float], after: dict[str, float]) -> bool:
    """|after - before| at most the standard error of the difference (equal when both are 0)."""
    return abs(after["rate"] - before["rate"]) <= math.hypot(before["se"], after["se"]) + 1e-12


def interference(history: list[dict[str, Any]], users: list[str]) -> list[dict[str, Any]]:
    """Across each update: every other user's own rate, and the base's rate under every
    checker, before (the previous measurement) and after."""
    rows = []
    for previous, point in zip(history, history[1:]):
        trained = point["trained"]
        pairs = [(other, other, other) for other in users if other != trained]
        pairs += [("base", "base", checker) for checker in users]
        for label, model, checker in pairs:
            before, after = previous["scores"][model][checker], point["scores"][model][checker]
            same = previous["reply_digests"][model] == point["reply_digests"][model]
            rows.append({"index": point["index"], "trained": trained, "model": label, "checker": checker,
                         "before": before["rate"], "after": after["rate"],
                         "delta": after["rate"] - before["rate"], "within_se": within_se(before, after),
                         "same_replies": same})  # fmt: skip
    return rows


def user_summary(history: list[dict[str, Any]], user: str, target: float) -> dict[str, Any]:
    mine = [history[0], *[p for p in history if p["trained"] == user]]
    reached = next((p for p in mine if own(p, user)["rate"] >= target), None)
    return {"start": own(mine[0], user), "final": own(mine[-1], user), "rounds": len(mine) - 1,
            "interactions": mine[-1]["interactions"][user], "reached": reached is not None,
            "interactions_to_target": reached["interactions"][user] if reached else None}  # fmt: skip


def general_deltas(general: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    for name, before in general.get("before", {}).items():
        after = general.get("after", {}).get(name)
        if after is not None:
            rows[name] = {"metric": before["metric"], "before": before, "after": after,
                          "delta": after["rate"] - before["rate"], "within_se": within_se(before, after),
                          "same_responses": before["responses_digest"] == after["responses_digest"],
                          }  # fmt: skip
    return rows


def summarise(args: Any, history: list[dict[str, Any]], tasks: tuple[list[Any], list[Any]],
              hashes: dict[str, str], general: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    users = args.users
    crossing = interference(history, users)
    return {
        "config": {key: value for key, value in vars(args).items()},
        "prompts": {"train": [vars(t) for t in tasks[0]], "heldout": [vars(t) for t in tasks[1]]},
        "users": {user: user_summary(history, user, args.target) for user in users},
        "others": {"all_within_se": all(row["within_se"] for row in crossing),
                   "max_abs_delta": max((abs(row["delta"]) for row in crossing), default=0.0),
                   "adapters_unchanged": all(p.get("other_adapters_unchanged", True) for p in history),
                   "same_replies": all(row["same_replies"] for row in crossing),
                   "rows": crossing},
        "base_hash": {**hashes, "unchanged": hashes["before"] == hashes["after"]},
        "general": {**general, "deltas": general_deltas(general)},
        "history": history,
    }  # fmt: skip


def table(result: dict[str, Any]) -> str:
    """The markdown report: user × round, each user's outcome, the base unchanged."""
    users, history = result["config"]["users"], result["history"]
    lines = ["| user | round | interactions | pairs | own rate ± se | other users' rates (Δ since the "
             "previous measurement) | base, this user's checker |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for user in users:
        lines.append(f"| {user} | 0 | 0 | 0 | {fmt(own(history[0], user))} | — | "
                     f"{fmt(history[0]['scores']['base'][user])} |")  # fmt: skip
    for previous, point in zip(history, history[1:]):
        user = point["trained"]
        others = "; ".join(f"{o} {fmt(own(point, o))} (Δ {delta(previous, point, o):+.2f})"
                           for o in users if o != user)  # fmt: skip
        lines.append(f"| {user} | {point['round']} | {point['interactions'][user]} | {point['pairs']} | "
                     f"{fmt(own(point, user))} | {others or '—'} | {fmt(point['scores']['base'][user])} |")
    lines += ["", f"| user | reached ≥ {result['config']['target']:.0%} | interactions | start | final |",
              "|---|---|---|---|---|"]  # fmt: skip
    for user, s in result["users"].items():
        reached = f"yes, after {s['interactions_to_target']}" if s["reached"] else "no"
        lines.append(f"| {user} | {reached} | {s['interactions']} | {fmt(s['start'])} | {fmt(s['final'])} |")
    others = result["others"]
    lines += ["", f"Other users' and the base's rates across every update: largest |Δ| "
              f"{others['max_abs_delta']:.3f}, all within se: {others['all_within_se']}; the same held-out "
              f"replies: {others['same_replies']}; other users' adapter files unchanged: "
              f"{others['adapters_unchanged']}. Base weights' hash before = after: "
              f"{result['base_hash']['unchanged']} ({result['base_hash']['before'][:12]}…)."]  # fmt: skip
    deltas = result["general"]["deltas"]
    if deltas:
        lines += ["", "| general evaluation (base) | metric | n | before ± se | after ± se | Δ | "
                  "same answers |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, row in deltas.items():
            lines.append(f"| {name} | {row['metric']} | {row['after']['n']} | {fmt(row['before'])} | "
                         f"{fmt(row['after'])} | {row['delta']:+.3f} | {row['same_responses']} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Left: each user's own rate against their interactions. Right: every user's rate at
    every measurement, the updates marked with whose they were."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    users, history = result["config"]["users"], result["history"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for user in users:
        mine = [history[0], *[p for p in history if p["trained"] == user]]
        left.errorbar([p["interactions"][user] for p in mine], [own(p, user)["rate"] for p in mine],
                      yerr=[own(p, user)["se"] for p in mine], marker="o", capsize=3, label=user)  # fmt: skip
        right.errorbar(range(len(history)), [own(p, user)["rate"] for p in history], marker="o", capsize=3,
                       yerr=[own(p, user)["se"] for p in history], label=user)  # fmt: skip
    for axis in (left, right):
        axis.axhline(result["config"]["target"], color="grey", linestyle="--", linewidth=1)
        axis.set_ylim(-0.05, 1.05)
        axis.set_ylabel("preference satisfied (held-out, greedy)")
        axis.legend()
    left.set_xlabel("feedback interactions of that user")
    left.set_title("each user's own adapter")
    right.set_xticks(range(len(history)), ["start", *[f"{p['trained']}\nr{p['round']}" for p in history[1:]]],
                     fontsize=7)  # fmt: skip
    right.set_xlabel("after the update of")
    right.set_title("every user's rate while one trains")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict[str, Any], out: Path) -> None:
    from ponder.fileio import write_json_atomic, write_text_atomic

    write_json_atomic(out / "simulation.json", result)
    write_text_atomic(out / "table.md", table(result) + "\n")
    plot(result, out / "satisfaction.png")
