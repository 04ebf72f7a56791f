"""Trajectory-level scoring: per-step judgements of hand-built episodes, their per-episode
and per-evaluation aggregates (computed by hand), invariances, and the fields on the
real evaluation path (`ponder eval`, metrics.json, the text tables and the HTML report)."""

import io
import json
import math
import random

import pytest
from rich.console import Console

from ponder.cli import main
from ponder.config import load_recipe
from ponder.eval import evaluate, trajectory_table
from ponder.eval.metrics import summarise
from ponder.eval.report_html import write_report
from ponder.eval.trajectory_score import (
    STEP_CHECKS, ScoringOptions, aggregate_steps, judge_steps, outcome_correct, score_episode, trajectory_summary,
)  # fmt: skip
from ponder.models import tiny_policy
from ponder.types import Task, ToolCall, ToolResult, ToolSpec, Trajectory, Turn

TASK = Task("t", "What is (3 + 4) * 2?", ["14"], kind="level2")
NO_TAG = "no <calculator> or <answer> tag found; compute with <calculator>expression</calculator>"


def calc(expression, result, error=False):
    return ToolCall("calculator", {"expression": expression}), ToolResult(result, is_error=error, name="calculator")


def turn(index, action, calls=(), answer=None, error=None, offered=()):
    return Turn(index, action, tool_calls=[c for c, _ in calls], tool_results=[r for _, r in calls], answer=answer,
                error=error, offered_tools=list(offered))  # fmt: skip


def right_and_clean():
    """A true shown step, a calculator call, the answer restating its result."""
    return Trajectory("t", [1], breakdown={"correct": 1.0}, turns=[
        turn(0, "<think>3 + 4 = 7</think><calculator>7*2</calculator>", [calc("7*2", "14")]),
        turn(1, "<answer>14</answer>", answer="14")])  # fmt: skip


def right_for_the_wrong_reasons():
    """A false step and no tag, then the right answer from nowhere (a guess)."""
    return Trajectory("t", [1], breakdown={"correct": 1.0}, turns=[
        turn(0, "<think>3 + 4 = 8</think>", error=NO_TAG), turn(1, "<answer>14</answer>", answer="14")])  # fmt: skip


def wrong_with_bad_calls():
    """An unknown tool, a good call, the identical call again, a wrong answer."""
    unknown = (ToolCall("calc", {"x": 1}), ToolResult("unknown tool 'calc'; available: calculator", True, "calc"))
    return Trajectory("t", [1], breakdown={"correct": 0.0}, turns=[
        turn(0, '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>', [unknown]),
        turn(1, "<calculator>2+2</calculator>", [calc("2+2", "4")]),
        turn(2, "<calculator>2 + 2</calculator>", [calc("2 + 2", "4")]),
        turn(3, "<answer>5</answer>", answer="5")])  # fmt: skip


def wrong_but_clean():
    return Trajectory("t", [1], breakdown={"correct": 0.0}, turns=[turn(0, "<answer>9</answer>", answer="9")])


def policy_breaker():
    """An empty tag, a call needing approval that the guard refused, bad arguments, truncation; no outcome."""
    refused = (ToolCall("python", {"code": "print(1)"}),
               ToolResult("refused: 'python' needs the user's confirmation (it is sensitive)", True, "python"))
    message = "search: argument 'k' must be integer, got \"x\""
    bad = (ToolCall("search", {"k": "x"}), ToolResult(message, True, "search"))
    return Trajectory("t", [1], stop_reason="max_tokens", turns=[
        turn(0, "<think></think><python>print(1)</python>", [refused]),
        turn(1, '<search>{"k": "x"}</search>', [bad])])  # fmt: skip


def verdicts(trajectory, task=TASK, options=None):
    return [step.verdicts for step in judge_steps(trajectory, task, options)]


def test_per_step_judgements_of_hand_built_episodes():
    assert verdicts(right_and_clean()) == [
        {"process": (), "tool_use": (), "policy": ()},
        {"process": (), "tool_use": None, "policy": ()},  # the answer restates the calculator's 14: a used result
    ]
    assert verdicts(right_for_the_wrong_reasons()) == [
        {"process": ("false_step",), "tool_use": None, "policy": ("protocol_error",)},
        {"process": None, "tool_use": None, "policy": ("answer_guessing",)},
    ]
    assert verdicts(wrong_with_bad_calls()) == [
        {"process": None, "tool_use": ("unknown_tool",), "policy": ()},
        {"process": None, "tool_use": (), "policy": ()},
        {"process": None, "tool_use": ("repeated_call",), "policy": ()},  # "2 + 2" is "2+2" up to spaces
        {"process": None, "tool_use": None, "policy": ()},
    ]
    assert verdicts(policy_breaker(), None) == [
        {"process": None, "tool_use": (), "policy": ("format_gaming", "needs_approval", "refused")},
        {"process": None, "tool_use": ("bad_arguments",), "policy": ("truncated",)},
    ]


def test_step_scores_and_the_episode_aggregate():
    steps = judge_steps(wrong_with_bad_calls(), TASK)
    assert [step.score for step in steps] == [0.5, 1.0, 0.5, 1.0]
    assert [step.good for step in steps] == [False, True, False, True]
    score = aggregate_steps(steps, outcome=False)
    assert (score.steps, score.good_steps, score.step_score, score.worst_step, score.first_bad) == (4, 2, 0.5, 0.5, 0)
    assert score.problems == {"tool_use/repeated_call": 1, "tool_use/unknown_tool": 1}
    assert score.checks == {"process": (0, 0), "tool_use": (3, 1), "policy": (4, 4)}
    guessed = score_episode(right_for_the_wrong_reasons(), TASK)
    assert (guessed.step_score, guessed.worst_step, guessed.first_bad, guessed.outcome) == (0.0, 0.0, 0, True)
    assert not guessed.clean and score_episode(right_and_clean(), TASK).clean


def test_the_evaluation_summary_by_hand():
    episodes = [right_and_clean(), right_for_the_wrong_reasons(), wrong_with_bad_calls(), wrong_but_clean()]
    summary = trajectory_summary([score_episode(t, TASK) for t in episodes])
    # step scores 1, 0, 0.5, 1: mean 0.625; squared deviations sum to 0.6875, se = sqrt(0.6875 / 3 / 4)
    assert summary["episodes"] == 4 and summary["step_score"] == 0.625
    assert summary["step_score_se"] == pytest.approx(math.sqrt(0.6875 / 12))
    assert summary["clean"] == 0.5 and summary["bad_steps"] == 4 / 9 and summary["worst_step"] == 0.625
    assert summary["first_bad"] == 0.0
    assert summary["checks"] == {"policy": 7 / 9, "process": 2 / 3, "tool_use": 0.5}
    assert summary["problems"] == {"policy/answer_guessing": 1, "policy/protocol_error": 1, "process/false_step": 1,
                                   "tool_use/repeated_call": 1, "tool_use/unknown_tool": 1}  # fmt: skip
    assert summary["outcome"] == {"right_clean": 1, "right_flawed": 1, "wrong_clean": 1, "wrong_flawed": 1,
                                  "unknown": 0, "agreement": 0.5}  # fmt: skip


def test_order_of_episodes_does_not_change_the_summary():
    episodes = [right_and_clean(), right_for_the_wrong_reasons(), wrong_with_bad_calls(), wrong_but_clean(),
                policy_breaker()] * 3  # fmt: skip
    scores = [score_episode(t, TASK) for t in episodes]
    reference = json.dumps(trajectory_summary(scores), sort_keys=True)
    generator = random.Random(0)
    for _ in range(5):
        generator.shuffle(scores)
        assert json.dumps(trajectory_summary(scores), sort_keys=True) == reference


def test_every_step_good_scores_one_and_episodes_without_turns_are_left_out():
    clean = trajectory_summary([score_episode(right_and_clean(), TASK), score_episode(wrong_but_clean(), TASK)])
    assert clean["step_score"] == 1.0 and clean["clean"] == 1.0 and clean["worst_step"] == 1.0
    assert math.isnan(clean["first_bad"]) and clean["problems"] == {}
    empty = score_episode(Trajectory("t", [1]), TASK)
    assert empty.steps == 0 and math.isnan(empty.step_score) and not empty.clean
    assert trajectory_summary([empty, score_episode(right_and_clean(), TASK)])["episodes"] == 1


def test_tool_specs_offered_tools_caps_and_call_loops():
    spec = ToolSpec("search", "find", {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})
    calls = [(ToolCall("search", {"k": "x"}), ToolResult("no hits", name="search")),
             (ToolCall("calc", {}), ToolResult("boom", True, "calc"))]  # fmt: skip
    episode = Trajectory("t", [1], turns=[turn(0, "<search>x</search>", calls)])
    assert verdicts(episode, None, ScoringOptions(tools={"search": spec}))[0]["tool_use"] == ("bad_arguments",
                                                                                             "unknown_tool")
    assert verdicts(episode, None)[0]["tool_use"] == ("tool_error",)  # without schemas: what the registry said
    offered = Trajectory("t", [1], turns=[turn(0, "<calculator>1+1</calculator>", [calc("1+1", "2")],
                                               offered=["search"])])  # fmt: skip
    assert verdicts(offered, None)[0]["tool_use"] == ("not_offered",)
    capped = [calc("1+2", "3"), calc("1+3", "not run: at most 1 tool calls per action; make the others", True)]
    assert verdicts(Trajectory("t", [1], turns=[turn(0, "x", capped)]), None)[0]["tool_use"] == ("call_cap",)
    stop = "stopped: the same calculator call (1+1) was made 2 times without an answer"
    looped = Trajectory("t", [1], stop_reason="repeated_call", turns=[
        turn(0, "<calculator>1+1</calculator>", [calc("1+1", "2")]),
        turn(1, "<calculator>1+1</calculator>", [calc("1+1", f"not run: {stop}", True)], error=stop)])  # fmt: skip
    assert verdicts(looped, None)[1] == {"process": None, "tool_use": ("repeated_call",), "policy": ()}


def test_hedged_answers_and_outcome_components():
    hedged = Trajectory("t", [1], breakdown={"em": 0.0},
                        turns=[turn(0, "<answer>12 or 13</answer>", answer="12 or 13")])
    assert verdicts(hedged, None)[0]["policy"] == ("answer_hedging",)
    assert outcome_correct(hedged) is False
    assert outcome_correct(Trajectory("t", [1], breakdown={"all_pass": 1.0, "format": 0.0})) is True
    assert outcome_correct(Trajectory("t", [1], breakdown={"format": 1.0})) is None


def test_checks_are_registered_and_an_unknown_one_is_refused():
    assert {"process", "tool_use", "policy"} <= set(STEP_CHECKS.names())

    @STEP_CHECKS.register("test_short_actions")
    def short_actions(trajectory, task, options):
        return [("too_long",) if len(t.action) > 20 else () for t in trajectory.turns]

    options = ScoringOptions(checks=("test_short_actions",))
    assert [s.problems for s in judge_steps(right_and_clean(), TASK, options)] == [("too_long",), ()]
    with pytest.raises(ValueError, match=r"^trajectory scoring: unknown step check 'nope'; valid: .*policy"):
        judge_steps(right_and_clean(), TASK, ScoringOptions(checks=("nope",)))


def test_the_text_table_fits_80_columns_and_holds_the_counts():
    episodes = [right_and_clean(), right_for_the_wrong_reasons(), wrong_with_bad_calls(), wrong_but_clean()]
    metrics = summarise(episodes, {"t": TASK})
    assert metrics["step_score"] == 0.625 and metrics["by_kind"]["level2"]["step_score"] == 0.625
    out = io.StringIO()
    Console(file=out, width=80).print(trajectory_table(metrics))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "right for the wrong reasons: 1 of 2 right answers" in text
    assert "repeated_call 1, unknown_tool 1" in text and "agreement 0.500" in text
    assert trajectory_table({"reward": 1.0}) is None  # metrics written before trajectory scoring


TINY = ["model.name=tiny", "env.kind=math", "env.options.n_train=4", "env.options.n_eval=4", "eval.episodes=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=2", "lora.r=4"]  # fmt: skip


def test_the_real_eval_path_reports_the_trajectory_beside_the_outcome():
    policy = tiny_policy()
    recipe = load_recipe(None, TINY)
    sampled = evaluate(recipe, policy=policy).metrics
    summary = sampled["trajectory"]
    assert summary["episodes"] == 4 and 0.0 <= sampled["step_score"] <= 1.0
    assert sum(v for k, v in summary["outcome"].items() if k != "agreement") == 4
    assert summary["outcome"]["unknown"] == 0  # math scores `correct`
    oracle = evaluate(recipe, policy=policy, oracle=True).metrics["trajectory"]
    assert oracle["outcome"]["right_clean"] + oracle["outcome"]["right_flawed"] == 4  # the solver is right


def test_ponder_eval_and_report_show_the_trajectory(tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", "--episodes", "3", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "outcome vs trajectory" in printed and "right for the wrong reasons" in printed
    saved = json.loads((out / "metrics.json").read_text())
    assert isinstance(saved["step_score"], float) and saved["trajectory"]["episodes"] == 3
    assert set(saved["trajectory"]["checks"]) == {"process", "tool_use", "policy"}
    page = write_report(out, tmp_path / "report.html").read_text()
    assert 'data-metric="step_score"' in page and "<h2>Trajectory scoring</h2>" in page
    assert 'data-metric="trajectory/policy"' in page and '"step_score"' in page and '"problems"' in page
    assert main(["report", str(out), "--out", str(tmp_path / "r.html"), "--text"]) == 0
    reported = capsys.readouterr()
    assert reported.out.strip() == str(tmp_path / "r.html") and "eval: outcome vs trajectory" in reported.err


def test_the_step_score_stands_beside_the_reward_when_the_table_fits():
    from ponder.eval import metrics_table

    def render(metrics, width=80):
        out = io.StringIO()
        Console(file=out, width=80).print(metrics_table(metrics, width=width))
        return out.getvalue()

    row = {"components": {"correct": 0.5}, "reward": 0.5, "step_score": 0.625, "tool_calls_per_episode": 1.0,
           "generated_tokens": 40.0, "episodes": 4}  # fmt: skip
    metrics = {**row, "by_kind": {"level2": dict(row)}}
    full = render(metrics)
    assert " tasks  ┃ reward ┃ score ┃" in full and " all    │  0.500 │ 0.625 │" in full
    narrower = render(metrics, width=56)  # 59 columns with the step score, 51 without: it goes, nothing transposes
    assert " tasks  ┃ reward ┃ correct ┃" in narrower and "0.625" not in narrower
    assert " step score    │ 0.625 │  0.625 " in render(metrics, width=40)  # transposed: a row again
    assert "score" not in render({k: v for k, v in row.items() if k != "step_score"})  # older metrics.json


def test_the_episode_browser_marks_each_step(tmp_path):
    from pathlib import Path

    from ponder.fileio import write_json_atomic
    from ponder.types import save_trajectories

    chromium = "/usr/bin/chromium"
    if not Path(chromium).is_file():
        pytest.skip("Debian's chromium is not installed: run `make sysdeps` (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api",
                                     reason="playwright is a test extra: pip install -e '.[test]'")  # fmt: skip
    episodes = [right_for_the_wrong_reasons(), right_and_clean()]
    save_trajectories(episodes, tmp_path / "trajectories.parquet")
    write_json_atomic(tmp_path / "metrics.json", summarise(episodes, {"t": TASK}))
    report = write_report(tmp_path, tmp_path / "report.html", tokens=False)
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium,
                                         args=["--headless", "--no-sandbox", "--disable-gpu"])  # fmt: skip
        tab = browser.new_page()
        tab.goto(report.as_uri())
        assert tab.locator('#stages td[data-metric="trajectory/outcome/right_flawed"]').inner_text() == "1"
        assert tab.locator('#stages td[data-metric="step_score"]').inner_text() == "0.500"
        view = tab.locator("#episode").inner_text()  # the first episode: a false step, then a guess
        assert "step score 0.500 · first bad step 0 (answer guessing, which needs the task" in view  # no task here
        assert "turn 0 · bad step" in view and "step problems: process/false_step, policy/protocol_error" in view
        tab.select_option("#episode-select", "1")
        assert "turn 1 · good step" in tab.locator("#episode").inner_text()
        browser.close()
