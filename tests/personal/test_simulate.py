"""examples/personal: the simulated users' checkers and rewriters (worked out by hand), the
prompts, the report's arithmetic, and the whole simulation on the tiny model (plumbing:
the tiny random model learns nothing, but every user gets an adapter, the other users'
replies and the base weights stay the same)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "personal"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"personal_example_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


prefs = _load("prefs")
report = _load("report")
CAR = prefs.UnitTask("t", "A car travels 3 hours at 40 km per hour. How far does it go?", 120, "km", "3 * 40 = 120")


@pytest.mark.parametrize(("reply", "liked"), [
    ("120 km.", True),
    ("  The car goes 120 kilometres.\n", True),          # surrounding whitespace is not a second line
    ("The car goes 120 km.\nThat is 3 * 40.", False),
    ("", False),
    ("It goes far.", False),                              # no quantity
    ("1" + "x" * 119, True),
    ("1" + "x" * 120, False),                             # 121 characters
])  # fmt: skip
def test_one_line(reply, liked):
    assert prefs.likes_one_line(reply, CAR) is liked


@pytest.mark.parametrize(("reply", "liked"), [
    ("It travels 120 kilometres.", True),
    ("3 * 40 = 120\nSo 120 Kilometers in all.", True),
    ("It's 120 kilometres, e.g. a long way.", True),      # "'s" and "e.g." are not units
    ("120 km", False),
    ("120 kilometres (120 km)", False),                   # written out, but abbreviated too
    ("120 kilometres at 40 km/h", False),
    ("120 kilometres in 3 hrs", False),
    ("120km, that is 120 kilometres", False),
    ("120 metres", False),                                # not this task's unit
    ('{"answer": 120, "unit": "kilometres"}', True),
])  # fmt: skip
def test_unit_words(reply, liked):
    assert prefs.likes_unit_words(reply, CAR) is liked


@pytest.mark.parametrize(("reply", "liked"), [
    ('{"answer": 120}', True),
    ('  {"answer": "120 km", "unit": "km"}\n', True),
    ('{\n  "answer": 120\n}', True),
    ('{"result": 120}', False),
    ('{"answer": true}', False),
    ('{"answer": "far"}', False),
    ("[120]", False),
    ('```json\n{"answer": 120}\n```', False),
    ('The answer is {"answer": 120}', False),
    ("120 km.", False),
])  # fmt: skip
def test_json(reply, liked):
    assert prefs.likes_json(reply, CAR) is liked


def test_rewrites_by_hand():
    assert prefs.rewrite_one_line(CAR) == "120 km."
    assert prefs.rewrite_unit_words(CAR) == "3 * 40 = 120.\nThe answer is 120 kilometres."
    assert prefs.rewrite_json(CAR) == '{\n  "answer": 120,\n  "unit": "km"\n}'


def test_each_rewrite_satisfies_only_its_user():
    for task in prefs.make_tasks(120, seed=3):
        for name, user in prefs.USERS.items():
            text = user.rewrite(task)
            liked_by = {other for other, sim in prefs.USERS.items() if sim.likes(text, task)}
            assert liked_by == {name}, (task.question, name, text, liked_by)


def test_prompts_are_distinct_seeded_and_right():
    train, heldout = prefs.split_tasks(32, 24, seed=0)
    assert (len(train), len(heldout)) == (32, 24)
    questions = [task.question for task in train + heldout]
    assert len(set(questions)) == len(questions)
    assert prefs.split_tasks(32, 24, seed=0) == (train, heldout) and prefs.split_tasks(32, 24, seed=1) != (
        train, heldout)  # fmt: skip
    for task in train + heldout:
        left, result = task.working.split(" = ")
        assert eval(left) == task.answer == int(result) and task.answer > 1  # noqa: S307 (our own arithmetic)
        assert re.search(rf"\d {task.unit}\b", task.question) and task.unit in prefs.UNIT_WORDS
    assert {task.unit for task in train + heldout} == set(prefs.UNIT_WORDS)


def test_rate_and_within_se():
    assert prefs.rate([True, False, True, True]) == {"rate": 0.75, "se": math.sqrt(0.75 * 0.25 / 4), "n": 4}
    assert prefs.rate([False] * 5) == {"rate": 0.0, "se": 0.0, "n": 5}
    with pytest.raises(ValueError):
        prefs.rate([])
    assert report.within_se({"rate": 0.5, "se": 0.1}, {"rate": 0.6, "se": 0.1})  # 0.1 <= 0.141
    assert not report.within_se({"rate": 0.5, "se": 0.1}, {"rate": 0.7, "se": 0.1})
    assert report.within_se({"rate": 0.0, "se": 0.0}, {"rate": 0.0, "se": 0.0})
    assert not report.within_se({"rate": 0.0, "se": 0.0}, {"rate": 0.25, "se": 0.0})


def test_the_simulation_runs_end_to_end_on_the_tiny_model(tmp_path):
    command = [sys.executable, str(EXAMPLE / "simulate.py"), "--model", "tiny", "--rounds", "1", "--batch", "2",
               "--heldout", "4", "--steps", "2", "--dpo-batch", "2", "--max-new-tokens", "8",
               "--users", "one_line,json", "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "simulation.json").read_text())
    history = result["history"]
    assert [(p["round"], p["trained"]) for p in history] == [(0, None), (1, "one_line"), (1, "json")]
    assert [p["interactions"] for p in history][-1] == {"one_line": 2, "json": 2}
    assert all(p["update"]["version"] == 1 for p in history[1:])
    assert result["base_hash"]["unchanged"] and result["others"]["adapters_unchanged"]
    assert result["others"]["same_replies"] and result["others"]["all_within_se"]
    assert len(result["prompts"]["train"]) == 2 and len(result["prompts"]["heldout"]) == 4
    assert (tmp_path / "satisfaction.png").stat().st_size > 0
    table = (tmp_path / "table.md").read_text()
    assert "| one_line | 1 | 2 | 2 |" in table and table in done.stdout


def _point(index, trained, rates, digests, interactions):
    scores = {model: {checker: {"rate": r, "se": 0.1, "n": 24} for checker, r in by.items()}
              for model, by in rates.items()}  # fmt: skip
    return {"index": index, "round": index, "trained": trained, "interactions": interactions, "scores": scores,
            "reply_digests": digests, "pairs": 2 * index, "other_adapters_unchanged": True}  # fmt: skip


def test_the_report_flags_another_users_change_and_finds_the_target(tmp_path):
    from types import SimpleNamespace

    base = {"one_line": 0.1, "json": 0.0}
    history = [
        _point(0, None, {"base": base, "one_line": base, "json": base}, {"base": "b", "one_line": "b", "json": "b"},
               {"one_line": 0, "json": 0}),
        _point(1, "one_line", {"base": base, "one_line": {"one_line": 0.95, "json": 0.0}, "json": base},
               {"base": "b", "one_line": "x", "json": "b"}, {"one_line": 8, "json": 0}),
        _point(2, "json", {"base": base, "one_line": {"one_line": 0.5, "json": 0.0},
                           "json": {"one_line": 0.0, "json": 0.5}},
               {"base": "b", "one_line": "y", "json": "z"}, {"one_line": 8, "json": 8}),
    ]  # fmt: skip
    args = SimpleNamespace(users=["one_line", "json"], target=0.9)
    result = report.summarise(args, history, ([], []), {"before": "h", "after": "h"}, {})
    assert result["users"]["one_line"] == {"start": history[0]["scores"]["one_line"]["one_line"],
                                           "final": history[1]["scores"]["one_line"]["one_line"], "rounds": 1,
                                           "interactions": 8, "reached": True, "interactions_to_target": 8}
    assert not result["users"]["json"]["reached"] and result["users"]["json"]["interactions"] == 8
    changed = [row for row in result["others"]["rows"] if not row["within_se"]]
    assert [(r["trained"], r["model"], r["delta"]) for r in changed] == [("json", "one_line", pytest.approx(-0.45))]
    assert not result["others"]["all_within_se"] and not result["others"]["same_replies"]
    assert result["others"]["max_abs_delta"] == pytest.approx(0.45) and result["base_hash"]["unchanged"]
    table = report.table(result)
    assert "| json | 2 | 8 | 4 | 0.50 ± 0.10 | one_line 0.50 ± 0.10 (Δ -0.45) | 0.00 ± 0.10 |" in table
    assert "| one_line | yes, after 8 | 8 | 0.10 ± 0.10 | 0.95 ± 0.10 |" in table
    report.plot(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0
