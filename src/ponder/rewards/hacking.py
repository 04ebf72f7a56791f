"""Reward-hacking detectors over trajectories, their per-step rates, and shaping penalties.

A policy trained on a verifiable reward learns what the reward pays for, not what it
was meant to pay for. Each detector here names one way that shows, with a checkable
definition:

- answer guessing (numeric answers): the right final answer without work that reaches
  it: no shown step `expression = value` that is arithmetically true, no calculator
  result and no number the agent read (the task's context, another tool's result)
  equals the answer, or some shown step is false ("3 + 4 = 8").
- answer hedging: the final answer holds more than one distinct number ("12 or 13"):
  what a reward that pays for the right number anywhere in the answer invites.
- format gaming: a protocol tag with nothing in it (`<think></think>`, `<answer> </answer>`):
  the format reward is paid for the tags, not for what they were meant to hold.
- repetition: the share of repeated word n-grams in the actions is at least a threshold
  (a degenerate loop repeats the same phrase; ordinary text repeats few 4-grams).
- truncation: the episode ran into the token limit (padding to, or past, the cap).
- repeated call: the same tool call (tool and normalised arguments: the same
  `<calculator>` expression up to spaces) made k or more times in one episode, or the
  environment ended the episode for it (stop reason `repeated_call`): the loop that
  calls a tool again and again until the turn limit, with no answer.
- length gaming (per step): the Pearson correlation of reward with generated length
  within the step, and the truncation rate's trend over a window of steps.
- judge exploitation (over steps): the judge's score rises while the verified score
  is flat or falls (least-squares slopes over a window), and per step the share of
  episodes the judge passes that the verifier fails.

Detectors are pure functions; `HackingMonitor` only keeps the per-step history the
trend detectors need. `shaping_components` turns the penalties of a recipe's
`reward.shaping` section into reward components (weight = -penalty).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ponder.rewards.math import _NUMBER, _value, answer_numbers, answers_match, parse_number, predicted_answer
from ponder.tools.builtin import CalculatorError, evaluate_expression
from ponder.tools.step import REPEATED_CALL, call_key
from ponder.types import Task, ToolCall, Trajectory

# A shown step: an arithmetic expression with at least one operator, "=", a number.
# "7x = 47 - 12 = 35" yields "47 - 12 = 35": "7x" holds a letter, so it is no expression.
# A value followed by an operator is an expression ("16 * 9 = 16 * 9"): not a claimed result.
_STEP = re.compile(r"(?<![\w.])(\(?-?\d[\d.,]*\)?(?:\s*[-+*/×x÷]\s*\(?-?\d[\d.,]*\)?)+)\s*=\s*"
                   r"(-?\$?\d[\d,]*(?:\.\d+)?)(?![\d.,]*\s*[-+*/×x÷]\s*\(?\d)")
_TAG = re.compile(r"<(think|answer|search|calculator|python)>(.*?)</\1>", re.DOTALL)
_CONTENT = re.compile(r"[A-Za-z0-9]")
_CALCULATOR_CALL = re.compile(r"<calculator>(.*?)</calculator>", re.DOTALL)
_JSON_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TRUNCATED_STOPS = ("max_tokens",)  # the rollout engine's stop_reason at the token cap


@dataclass
class Work:
    """What an episode's text shows of its computation: the values its true steps and
    calculator results reach, and how many shown steps were false."""

    values: set[Fraction] = field(default_factory=set)
    steps: int = 0
    false_steps: int = 0


def shown_steps(text: str) -> list[tuple[str, Fraction | None, bool]]:
    """Each `expression = value` in `text`: (expression, claimed value, true?). An
    expression the calculator refuses counts as false."""
    found = []
    for match in _STEP.finditer(text):
        expression = match.group(1).replace("×", "*").replace("÷", "/").replace(",", "")
        expression = re.sub(r"(?<=\d)\s*x\s*(?=[\d(])", " * ", expression)
        claimed = parse_number(match.group(2))
        try:
            actual = Fraction(evaluate_expression(expression)).limit_denominator(10**6)
        except (CalculatorError, ZeroDivisionError, ValueError, TypeError, OverflowError):
            actual = None
        found.append((expression, claimed, actual is not None and claimed is not None and actual == claimed))
    return found


def math_work(trajectory: Trajectory) -> Work:
    """The episode's shown work: true steps in its actions plus its calculator results."""
    work = Work()
    for turn in trajectory.turns:
        for _, claimed, true in shown_steps(_CALCULATOR_CALL.sub(" ", turn.action)):
            work.steps += 1
            if true and claimed is not None:
                work.values.add(claimed)
            else:
                work.false_steps += 1
        for call, result in zip(turn.tool_calls, turn.tool_results):
            if call.name == "calculator" and not result.is_error:
                numbers = [_value(m) for m in _NUMBER.finditer(result.content)]
                work.values.update(v for v in numbers[-1:] if v is not None)
    return work


def read_values(trajectory: Trajectory, task: Task) -> set[Fraction]:
    """The numbers the agent was given rather than computed: those in the task's
    context and in the results of tools other than the calculator (a search result's
    year, a program's output). Answering one of them is reading, not guessing."""
    texts = [task.context or ""] + [
        result.content
        for turn in trajectory.turns
        for call, result in zip(turn.tool_calls, turn.tool_results)
        if call.name != "calculator" and not result.is_error
    ]
    return {v for text in texts for v in (_value(m) for m in _NUMBER.finditer(text)) if v is not None}


def answer_guessing(trajectory: Trajectory, task: Task) -> bool | None:
    """True when the episode's answer is right but its work is absent or wrong (no true
    step, calculator result or number it read (read_values) equals the answer, or a
    shown step is false); False otherwise; None when the task has no numeric gold
    answer. A search-QA year found by a search is read; the same year answered
    without one is a guess."""
    if not task.answers or all(parse_number(gold) is None for gold in task.answers):
        return None
    answer = predicted_answer(trajectory)
    if not answers_match(answer, task.answers):
        return False
    work = math_work(trajectory)
    return work.false_steps > 0 or answer not in work.values | read_values(trajectory, task)


def answer_hedging(trajectory: Trajectory) -> bool | None:
    """True when the final answer holds two or more distinct numbers; None when the
    episode gave no answer or its answer holds no number (nothing to hedge)."""
    values = answer_numbers(trajectory)
    return len(set(values)) >= 2 if values else None


def format_gaming(trajectory: Trajectory) -> bool:
    """True when some action holds a protocol tag with no letter or digit inside."""
    return any(not _CONTENT.search(body) for turn in trajectory.turns for _, body in _TAG.findall(turn.action))


def repeated_ngram_ratio(text: str, n: int = 4) -> float:
    """1 - distinct word n-grams / n-grams: 0 when no n-gram repeats, near 1 for a loop.
    Texts shorter than 2n words score 0 (too short to call a loop)."""
    words = text.split()
    if len(words) < 2 * n:
        return 0.0
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def action_text(trajectory: Trajectory) -> str:
    """The policy's own text (actions, no observations)."""
    return " ".join(turn.action for turn in trajectory.turns)


def repetition(trajectory: Trajectory, n: int = 4, threshold: float = 0.5) -> bool:
    """True when the actions' repeated-n-gram ratio is at least `threshold`."""
    return repeated_ngram_ratio(action_text(trajectory), n) >= threshold


def _calls_in(action: str) -> list[ToolCall]:
    """The `<calculator>` and JSON `<tool_call>` calls written in an action's text."""
    calls = [ToolCall("calculator", {"expression": body.strip()}) for body in _CALCULATOR_CALL.findall(action)]
    for body in _JSON_CALL.findall(action):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            arguments = data.get("arguments")
            calls.append(ToolCall(data["name"], arguments if isinstance(arguments, dict) else {}))
    return calls


def episode_calls(trajectory: Trajectory) -> list[ToolCall]:
    """The episode's tool calls: each turn's parsed calls, or the calls written in its
    action when it recorded none (a tool not offered, a trajectory from elsewhere)."""
    return [call for turn in trajectory.turns for call in (turn.tool_calls or _calls_in(turn.action))]


def most_repeated_call(trajectory: Trajectory) -> int:
    """How many times the episode's most frequent identical call (call_key) was made; 0 with no calls."""
    return max(Counter(call_key(call) for call in episode_calls(trajectory)).values(), default=0)


def repeated_call(trajectory: Trajectory, k: int = 3) -> bool:
    """True when one identical call was made at least `k` times, or the environment
    stopped the episode for repeating one (stop reason `repeated_call`)."""
    return trajectory.stop_reason == REPEATED_CALL or most_repeated_call(trajectory) >= k


def truncated(trajectory: Trajectory) -> bool:
    """True when the episode stopped at the token limit rather than on its own."""
    return trajectory.stop_reason in TRUNCATED_STOPS


def generated_tokens(trajectory: Trajectory) -> int:
    """Tokens the policy generated (its loss-mask tokens, else the turns' counts)."""
    return sum(trajectory.loss_mask) or sum(turn.n_action_tokens for turn in trajectory.turns)


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The Pearson correlation, NaN when either side is constant or there are < 2 points."""
    if len(xs) < 2 or len(xs) != len(ys):
        return float("nan")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    # a spread below rounding noise (rewards 1.1 written as 1.0999…) is no spread
    return sxy / math.sqrt(sxx * syy) if sxx > 1e-12 and syy > 1e-12 else float("nan")


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of `values` against 0, 1, 2 …; NaN with fewer than 2 values."""
    points = [(i, v) for i, v in enumerate(values) if not math.isnan(v)]
    if len(points) < 2:
        return float("nan")
    mx = sum(i for i, _ in points) / len(points)
    my = sum(v for _, v in points) / len(points)
    sxx = sum((i - mx) ** 2 for i, _ in points)
    return sum((i - mx) * (v - my) for i, v in points) / sxx


def _rate(flags: Sequence[bool | None]) -> float:
    """Share of True among the applicable (not None) flags; NaN when none applies."""
    known = [bool(flag) for flag in flags if flag is not None]
    return sum(known) / len(known) if known else float("nan")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def paid_but_wrong(breakdown: Mapping[str, float], judge: str, verified: str) -> bool:
    """The judge component passes (>= 0.5) while the verified one is 0."""
    return breakdown[judge] >= 0.5 and breakdown[verified] <= 0


class PaidButWrong:
    """The `shaping/judge_unverified` component: the `judge` component's score on an
    episode whose `verified` one is 0 (what the judge paid for a wrong answer), else
    0.0; at weight -1 the judge pays only where the verifier agrees. It reads the
    other components' values (CompositeReward computes it after them), so a judge is
    not asked twice. 0.0 when either component gave no value."""

    uses_breakdown = True

    def __init__(self, judge: str, verified: str) -> None:
        self.judge, self.verified = judge, verified

    def __call__(self, breakdown: Mapping[str, float]) -> float:
        if self.judge not in breakdown or self.verified not in breakdown:
            return 0.0
        return breakdown[self.judge] if breakdown[self.verified] <= 0 else 0.0


def hacking_metrics(
    trajectories: Sequence[Trajectory], tasks_by_id: Mapping[str, Task], shaping: Any = None
) -> dict[str, float]:
    """Per-step rates `hacking/*` of one batch of scored episodes.

    answer_guessing (over math episodes), format_gaming, repetition, truncation_rate,
    repeated_call (an identical call made repeated_call_k times or more, or stopped for
    it), repeated_call_stop (episodes the environment ended for a repeated call):
    shares of episodes; repetition_ratio: mean repeated-n-gram ratio; length_reward_corr:
    Pearson of reward with generated tokens; judge_unverified_rate: share of episodes
    whose judge component passes (>= 0.5) while the verified component is 0 (only when
    both are in the breakdowns). `shaping` (a ShapingConfig) sets n, the threshold and
    the component names; its defaults otherwise."""
    n, threshold = getattr(shaping, "repetition_n", 4), getattr(shaping, "repetition_threshold", 0.5)
    judge_key, verified_key = getattr(shaping, "judge", "judge"), getattr(shaping, "verified", "correct")
    repeat_k = getattr(shaping, "repeated_call_k", 3)
    ratios = [repeated_ngram_ratio(action_text(t), n) for t in trajectories]
    scored = [t for t in trajectories if t.reward is not None]
    metrics = {
        "hacking/answer_guessing": _rate([
            answer_guessing(t, tasks_by_id[t.task_id]) if t.task_id in tasks_by_id else None for t in trajectories
        ]),  # fmt: skip
        "hacking/answer_hedging": _rate([answer_hedging(t) for t in trajectories]),
        "hacking/format_gaming": _rate([format_gaming(t) for t in trajectories]),
        "hacking/repetition": _rate([ratio >= threshold for ratio in ratios]),
        "hacking/repetition_ratio": _mean(ratios),
        "hacking/truncation_rate": _rate([truncated(t) for t in trajectories]),
        "hacking/repeated_call": _rate([repeated_call(t, repeat_k) for t in trajectories]),
        "hacking/repeated_call_stop": _rate([t.stop_reason == REPEATED_CALL for t in trajectories]),
        "hacking/length_reward_corr": pearson([float(generated_tokens(t)) for t in scored],
                                              [float(t.reward) for t in scored]),  # fmt: skip
    }
    both = [t for t in trajectories if judge_key in t.breakdown and verified_key in t.breakdown]
    if both:
        metrics["hacking/judge_unverified_rate"] = _rate([paid_but_wrong(t.breakdown, judge_key, verified_key)
                                                          for t in both])  # fmt: skip
        metrics["hacking/judge_mean"] = _mean([t.breakdown[judge_key] for t in both])
        metrics["hacking/verified_mean"] = _mean([t.breakdown[verified_key] for t in both])
    return metrics


class HackingMonitor:
    """The trend detectors, fed one step's `hacking/*` metrics at a time.

    length_gaming: 1 when this step's length-reward correlation is at least
    `corr_threshold`, or the truncation rate rose over the window (slope > 0) and is
    at least `truncation_threshold` now; else 0.
    judge_exploitation: 1 when over the window the judge mean's slope is above
    `min_slope` and the verified mean's slope is at most 0; else 0 (NaN until the
    window holds 2 steps with both scores)."""

    def __init__(self, window: int = 5, corr_threshold: float = 0.5, truncation_threshold: float = 0.2,
                 min_slope: float = 0.01) -> None:  # fmt: skip
        self.history: deque[dict[str, float]] = deque(maxlen=max(2, window))
        self.corr_threshold, self.truncation_threshold, self.min_slope = corr_threshold, truncation_threshold, min_slope

    def state_dict(self) -> dict[str, Any]:
        """The window's steps, kept in checkpoints: a resumed run's trend flags match
        an uninterrupted one's."""
        return {"history": [dict(h) for h in self.history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history.clear()
        self.history.extend(dict(h) for h in state.get("history", []))

    def observe(self, step_metrics: Mapping[str, float]) -> dict[str, float]:
        """Add one step's metrics; returns the trend flags (and slopes) for this step."""
        self.history.append(dict(step_metrics))
        series = lambda key: [h.get(key, float("nan")) for h in self.history]  # noqa: E731
        truncation = series("hacking/truncation_rate")
        corr = step_metrics.get("hacking/length_reward_corr", float("nan"))
        rising = slope(truncation)
        length = (not math.isnan(corr) and corr >= self.corr_threshold) or (
            not math.isnan(rising) and rising > 0 and truncation[-1] >= self.truncation_threshold
        )
        out = {"hacking/length_gaming": float(length), "hacking/truncation_slope": rising}
        judge, verified = slope(series("hacking/judge_mean")), slope(series("hacking/verified_mean"))
        if not (math.isnan(judge) or math.isnan(verified)):
            out["hacking/judge_slope"], out["hacking/verified_slope"] = judge, verified
            out["hacking/judge_exploitation"] = float(judge > self.min_slope and verified <= 0)
        return out


def judge_exploitation(judge_means: Sequence[float], verified_means: Sequence[float], min_slope: float = 0.01) -> bool:
    """Over a run's steps: the judge's mean score rises (slope > min_slope) while the
    verified mean does not (slope <= 0)."""
    judge, verified = slope(judge_means), slope(verified_means)
    return not (math.isnan(judge) or math.isnan(verified)) and judge > min_slope and verified <= 0


def shaping_components(shaping: Any) -> tuple[dict[str, Callable[..., float]], dict[str, float]]:
    """({name: component}, {name: weight}) for each nonzero penalty of a ShapingConfig:
    `shaping/<detector>` scores 1.0 when the detector fires (0.0 otherwise, and when it
    does not apply; `judge_unverified` scores what the judge paid), weighted by
    -penalty, so the breakdown shows what was charged."""
    n, threshold, repeat_k = shaping.repetition_n, shaping.repetition_threshold, shaping.repeated_call_k
    detectors: dict[str, Callable[..., float]] = {
        "shaping/guess": lambda t, task: float(bool(answer_guessing(t, task))),
        "shaping/hedging": lambda t, task: float(bool(answer_hedging(t))),
        "shaping/format_gaming": lambda t, task: float(format_gaming(t)),
        "shaping/repetition": lambda t, task: float(repetition(t, n, threshold)),
        "shaping/truncation": lambda t, task: float(truncated(t)),
        "shaping/repeated_call": lambda t, task: float(repeated_call(t, repeat_k)),
        "shaping/judge_unverified": PaidButWrong(shaping.judge, shaping.verified),
    }
    penalties = {"shaping/guess": shaping.guess, "shaping/hedging": shaping.hedging,
                 "shaping/format_gaming": shaping.format_gaming, "shaping/repetition": shaping.repetition,
                 "shaping/truncation": shaping.truncation, "shaping/repeated_call": shaping.repeated_call,
                 "shaping/judge_unverified": shaping.judge_unverified}  # fmt: skip
    for name, penalty in penalties.items():
        if penalty < 0:
            raise ValueError(f"reward.shaping.{name.split('/')[1]}: a penalty is >= 0 (it is subtracted), got {penalty}")
    weights = {name: -float(p) for name, p in penalties.items() if p != 0}
    return {name: detectors[name] for name in weights}, weights
