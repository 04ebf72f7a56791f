"""The console tables (`ponder gain`, `ponder eval`, `make demo`) fit in 80 columns,
the width of a pipe or a CI log, with every cell whole: no line wider, no "…"."""

import io

import pytest
from rich.console import Console

from ponder.eval.gain import StagePair, gain_table, runs_table
from ponder.eval.report import metrics_table
from ponder.jobs.demo_table import demo_table
from ponder.types import Trajectory

KINDS = ("in_prompt", "multi_hop", "single_hop")
NEEDED = {"in_prompt": 0, "multi_hop": 2, "single_hop": 1}
TIMING = {
    "eval:oracle": 0.3,
    "eval:base": 13,
    "sft": 171,
    "eval:sft": 26,
    "rl": 389,
    "eval:rl": 26,
    "total": 629,
}


def _render(renderable) -> list[str]:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


def _assert_fits(lines):
    assert lines, "nothing rendered"
    too_wide = [line for line in lines if len(line) > 80]
    assert too_wide == []
    assert not any("…" in line for line in lines)


def _pair(before_searches, after_searches, before_rewards, after_rewards):
    """Three episodes per kind (one row per KINDS entry, repeated)."""
    kinds = [kind for kind in KINDS for _ in range(3)]

    def episodes(searches, rewards):
        return [Trajectory(f"t{i}", [], reward=r, metrics={"searches": float(n)})
                for i, (n, r) in enumerate(zip(searches, rewards))]  # fmt: skip

    return StagePair(episodes(before_searches, before_rewards), episodes(after_searches, after_rewards),
                     kinds, [NEEDED[kind] for kind in kinds])  # fmt: skip


@pytest.fixture
def pairs():
    first = _pair([1, 1, 2, 2, 2, 3, 1, 1, 1], [0, 0, 1, 2, 2, 2, 1, 1, 2],
                  [0, 1, 0, 1, 1, 0, 1, 0, 1], [1, 1, 0, 1, 1, 1, 1, 0, 1])  # fmt: skip
    second = _pair([1] * 9, [0, 0, 0, 2, 2, 2, 1, 1, 1], [0.5] * 9, [0.75] * 9)
    return [first, second]


def test_gain_tables_fit_in_80_columns_with_every_value_whole(pairs):
    lines = _render(gain_table(pairs, "sft", "rl"))
    _assert_fits(lines)
    text = "\n".join(lines)
    # all tasks: before (5/9 + 0.5) / 2, after (7/9 + 0.75) / 2, gain their difference;
    # both runs evaluated tasks t0..t8, so n counts 9 tasks, each averaged over the runs
    assert "│ all        │ 9 │ 0.528 │ 0.764 │ 0.236 │" in text
    # in_prompt searches: sft 1, 1, 2 and 1, 1, 1 → 7/6; rl 0, 0, 1 and 0, 0, 0 → 1/6;
    # shares: sft all searched at least once, one of six twice; rl one of six once
    assert "│ in_prompt  │ sft   │     1.17 │ 1.00 │ 0.17 │   0.00 │  1.17 │" in text
    assert "│            │ rl    │     0.17 │ 0.17 │ 0.00 │   0.00 │  0.17 │" in text
    # by searches made, in_prompt after SFT: one search in 5 of 6 episodes (rewards 0, 1
    # and 0.5 three times: mean 0.5), two in 1 of 6 (reward 0); none and ≥ 3 never
    assert "│ in_prompt  │ sft   │          – │  83% +0.50 │  17% +0.00 │          – │" in text


def test_runs_table_fits_in_80_columns_with_long_run_names(pairs):
    names = ["runs/d-reinforce-seed-1", "runs/d-reinforce-seed-2"]
    lines = _render(runs_table(pairs, names, "sft", "rl"))
    _assert_fits(lines)
    text = "\n".join(lines)
    assert "│ runs/d-reinforce-seed-2 │ 9 │ 0.500 │ 0.750 │ 0.250 │" in text
    assert "│ runs/d-reinforce-seed-2 │ 1.00 → 0.00 │ 1.00 → 2.00 │ 1.00 → 1.00 │" in text


def _stage(reward, searches, by_kind):
    row = {"episodes": 100, "reward": reward, "reward_se": 0.05, "em": reward, "format": 0.91,
           "searches_per_episode": searches}  # fmt: skip
    return {**row, "by_kind": {kind: {"searches_per_episode": value} for kind, value in by_kind.items()}}


def test_demo_table_fits_in_80_columns_with_one_column_per_stage():
    results = {
        "eval_temperature": 1.0,
        "stages": {
            "base": _stage(0.0, 0.0, dict.fromkeys(KINDS, 0.0)),
            "sft": _stage(0.634, 1.27, {"in_prompt": 0.72, "multi_hop": 1.78, "single_hop": 1.45}),
            "rl": _stage(0.688, 1.13, {"in_prompt": 0.41, "multi_hop": 1.75, "single_hop": 1.41}),
            "oracle": _stage(1.007, 0.93, {"in_prompt": 0.0, "multi_hop": 2.0, "single_hop": 1.0}),
        },
        "timing_s": TIMING,
    }
    lines = _render(demo_table(results))
    _assert_fits(lines)
    text = "\n".join(lines)
    assert "before SFT ┃ after SFT ┃ after RL ┃ oracle ┃" in text
    assert "│ reward              │      0.000 │     0.634 │    0.688 │  1.007 │" in text
    assert "│ searches in_prompt  │       0.00 │      0.72 │     0.41 │   0.00 │" in text
    # the timing caption breaks between stages, never inside one ("rl" / "389 s")
    assert any("rl 389 s" in line for line in lines)


def test_metrics_table_fits_in_80_columns():
    components = {"em": 0.67, "f1": 0.7123, "format": 0.91, "search_cost": 1.27}
    row = {"components": components, "reward": 0.634, "tool_calls_per_episode": 1.27,
           "turns": 2.31, "generated_tokens": 143.2, "episodes": 100}  # fmt: skip
    metrics = {**row, "by_kind": {kind: dict(row) for kind in KINDS},
               "tokens_per_s": 41.3, "generation_s": 120.4, "env_s": 3.2, "wall_s": 130.0}  # fmt: skip
    lines = _render(metrics_table(metrics, title="smollm2 on 100 held-out tasks"))
    _assert_fits(lines)
    assert " single_hop │  0.634 │ 0.67 │ 0.71 │   0.91 │   1.27 │     1.27 │    143 │ 100 " in lines


FC_COMPONENTS = {"arguments": 0.7, "contains_answer": 0.4, "correct": 0.5, "format": 0.9, "function_name": 0.6,
                 "search_cost": 0.1, "valid_call": 0.8}  # fmt: skip


def _many_components(kinds):
    row = {"components": FC_COMPONENTS, "reward": 0.634, "tool_calls_per_episode": 1.27,
           "generated_tokens": 143.2, "episodes": 100}  # fmt: skip
    return {**row, "by_kind": {kind: dict(row) for kind in kinds},
            "tokens_per_s": 41.3, "generation_s": 120.4, "env_s": 3.2, "wall_s": 130.0}  # fmt: skip


def test_metrics_table_with_many_components_is_transposed_never_cut():
    kinds = ("simple", "multiple", "parallel", "parallel_multiple")
    lines = _render(metrics_table(_many_components(kinds), title="fc on 100 held-out tasks"))
    _assert_fits(lines)  # rich would have cut every header: "rewa…", "con… ans…"
    for name in ("reward", *FC_COMPONENTS, "tool calls/ep", "tokens / ep"):
        assert any(line.split("│")[0].strip() == name for line in lines), name  # one row per metric, whole
    header = " ".join(lines[:4])
    assert all(word in header for word in ("all", "simple", "multiple", "parallel"))
    assert " contains_answer │  0.40 │   0.40 │     0.40 │     0.40 │     0.40 " in lines


def test_metrics_table_with_many_kinds_splits_them_over_tables_that_fit():
    kinds = [f"kind_number_{i}" for i in range(9)]
    lines = _render(metrics_table(_many_components(kinds), title="fc"))
    _assert_fits(lines)
    assert any("fc (continued)" in line for line in lines)
    assert sum(line.split("│")[0].strip() == "contains_answer" for line in lines) == 2
    headers = " ".join(line for line in lines if line.startswith(" " * 17 + "┃")).replace("┃", " ").split()
    assert sorted(word for word in headers if word.isdigit()) == [str(i) for i in range(9)]  # each kind once


def test_a_wide_terminal_keeps_the_table_by_kind():
    table = metrics_table(_many_components(("simple", "multiple")), width=200)
    assert [column.header for column in table.columns][:3] == ["tasks", "reward", "arguments"]


def test_tables_show_any_environment_s_own_reward_components():
    """A math environment's components (no searches): each is a row of the demo table and
    a column of the eval table; the per-kind section shows rewards, no search rows."""
    def stage(correct, by_kind):
        kinds = {kind: {"reward": value, "components": {"correct": value}} for kind, value in by_kind.items()}
        return {"episodes": 40, "reward": correct + 0.1, "reward_se": 0.02, "searches_per_episode": 0.0,
                "components": {"correct": correct, "format": 1.0}, "by_kind": kinds}  # fmt: skip

    results = {"eval_temperature": 0.0, "stages": {"sft": stage(0.25, {"d1": 0.5, "d2": 0.0}),
                                                   "rl": stage(0.5, {"d1": 0.75, "d2": 0.25})}}  # fmt: skip
    text = "\n".join(_render(demo_table(results)))
    assert "│ correct   │     0.250 │    0.500 │" in text
    assert "│ format    │     1.000 │    1.000 │" in text
    assert "│ reward d2 │     0.000 │    0.250 │" in text
    assert "searches" not in text
    lines = _render(metrics_table(results["stages"]["rl"]))
    _assert_fits(lines)
    assert any(line.startswith(" all   │  0.600 │    0.50 │   1.00 │") for line in lines)


def test_environments_without_search_get_the_reward_table_alone(pairs):
    quiet = [StagePair([Trajectory(t.task_id, [], reward=t.reward) for t in p.before],
                       [Trajectory(t.task_id, [], reward=t.reward) for t in p.after], p.kinds, p.needed)
             for p in pairs]  # fmt: skip
    assert len(gain_table(quiet, "sft", "rl").renderables) == 1
    assert len(runs_table(quiet, ["a", "b"], "sft", "rl").renderables) == 1
    assert len(gain_table(pairs, "sft", "rl").renderables) == 3  # searched: the search tables too
