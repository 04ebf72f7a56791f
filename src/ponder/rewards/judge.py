"""LLM-as-judge rewards: a rubric prompt to a model, its reply parsed to a score.

The judge is any `complete(messages) -> text` function: a served model over the
OpenAI API (`openai_completion`, e.g. `ponder serve` or vLLM) or a local ponder
policy (wired in ponder.wiring). Pointwise, the judge scores one response on a
scale; pairwise, it picks the better of the response and the task's reference, asked
in both orders so a judge that prefers whichever answer comes first (position bias)
is averaged out and counted.

A judge's reply is free text and often malformed. Parsing never guesses: no score,
two different scores, or a score outside the scale is a JudgeParseError naming the
reply. What the reward then does is `on_unparsable`: `error` (raise: stop the run)
or `none` (the episode is unscorable: the composite reward is None, RL leaves it
out of its baselines, and `unparsable` counts it). A parse failure is never a 0.

Self-rewarding (the policy judges its own episodes) is HACKABLE by construction: the
model being optimised also sets its reward, so it can learn to please itself rather
than to be right. Use it only with a verified score next to it and watch
`hacking/judge_exploitation`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ponder.types import Task, Trajectory

Complete = Callable[[list[dict[str, str]]], str]

DEFAULT_RUBRIC = (
    "You are a strict grader. Rate how correct and well reasoned the response is as an answer "
    "to the question, from {low} (wrong) to {high} (correct, with sound reasoning).\n\n"
    "Question:\n{question}\n\nResponse:\n{response}\n\n"
    "Reply with one line: Score: <a whole number from {low} to {high}>"
)
PAIRWISE_RUBRIC = (
    "You are a strict grader. Which answer to the question is more correct and better reasoned?\n\n"
    "Question:\n{question}\n\nAnswer A:\n{first}\n\nAnswer B:\n{second}\n\n"
    "Reply with one line: Verdict: A, Verdict: B or Verdict: tie"
)
_SCORE = re.compile(r"(?:score|rating)\s*(?:is)?\s*[:=]?\s*\**\s*(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+))?", re.IGNORECASE)
_BRACKETED = re.compile(r"\[\[\s*(-?\d+(?:\.\d+)?)\s*\]\]")
_VERDICT = re.compile(r"verdict\s*[:=]?\s*\**\s*\[*\s*(A|B|tie)\b", re.IGNORECASE)
ON_UNPARSABLE = ("none", "error")


class JudgeParseError(ValueError):
    """The judge's reply holds no usable verdict; one line naming why and the reply."""


def _quoted(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "…")


def parse_score(text: str, low: float, high: float) -> float:
    """The one score in a judge's reply ("Score: 7", "score = 7/10", "[[7]]").

    Raises JudgeParseError when there is none, when two different scores are given
    (the same score repeated is fine), when a "/N" scale is not `high`, or when the
    score lies outside [low, high]."""
    found: list[float] = []
    for match in _SCORE.finditer(text):
        if match.group(2) is not None and float(match.group(2)) != high:
            raise JudgeParseError(f"judge scored on /{match.group(2)}, not /{high:g}: {_quoted(text)}")
        found.append(float(match.group(1)))
    found += [float(value) for value in _BRACKETED.findall(text)]
    distinct = sorted(set(found))
    if not distinct:
        raise JudgeParseError(f"no score in the judge's reply: {_quoted(text)}")
    if len(distinct) > 1:
        raise JudgeParseError(f"the judge gave {len(distinct)} different scores {distinct}: {_quoted(text)}")
    if not low <= distinct[0] <= high:
        raise JudgeParseError(f"judge score {distinct[0]:g} outside [{low:g}, {high:g}]: {_quoted(text)}")
    return distinct[0]


def parse_verdict(text: str) -> str:
    """"A", "B" or "tie" from "Verdict: A" (or "[[A]]"); JudgeParseError when there is
    none or the reply names two different verdicts."""
    found = {match.group(1).upper() if match.group(1).lower() != "tie" else "tie" for match in _VERDICT.finditer(text)}
    found |= {v.upper() if v.lower() != "tie" else "tie" for v in re.findall(r"\[\[\s*(A|B|tie)\s*\]\]", text, re.I)}
    if not found:
        raise JudgeParseError(f"no verdict in the judge's reply: {_quoted(text)}")
    if len(found) > 1:
        raise JudgeParseError(f"the judge gave different verdicts {sorted(found)}: {_quoted(text)}")
    return found.pop()


@dataclass
class PairwiseResult:
    """`first` against `second`, judged in both orders. prefer_first: the mean of the two
    orders' outcomes for `first` (1 win, 0.5 tie, 0 loss); consistent: both orders agree
    (False is position bias: the judge preferred a slot, not an answer)."""

    prefer_first: float
    consistent: bool
    verdicts: tuple[str, str]


def pairwise(complete: Complete, question: str, first: str, second: str, rubric: str = PAIRWISE_RUBRIC) -> PairwiseResult:
    """Ask the judge with `first` as A, then with `first` as B; average the outcomes."""
    forward = parse_verdict(complete([{"role": "user", "content": rubric.format(question=question, first=first,
                                                                                second=second)}]))  # fmt: skip
    backward = parse_verdict(complete([{"role": "user", "content": rubric.format(question=question, first=second,
                                                                                 second=first)}]))  # fmt: skip
    win_forward = {"A": 1.0, "B": 0.0, "tie": 0.5}[forward]
    win_backward = {"A": 0.0, "B": 1.0, "tie": 0.5}[backward]
    return PairwiseResult((win_forward + win_backward) / 2, win_forward == win_backward, (forward, backward))


def response_of(trajectory: Trajectory) -> str:
    """What the judge reads: the episode's actions and observations as text."""
    return trajectory.response_text.strip()


class JudgeReward:
    """A reward component `(trajectory, task) -> float | None` scored by a judge.

    Pointwise: the parsed score mapped onto [0, 1] ((score - low) / (high - low)).
    Pairwise: the response against the task's reference (its first oracle action, else
    its first gold answer), `pairwise` in both orders; position_disagreements counts
    the episodes whose two orders disagreed. Parse failures follow on_unparsable
    (module docstring); `unparsable` counts them."""

    def __init__(self, complete: Complete, config: Any, hackable: bool = False) -> None:
        if config.on_unparsable not in ON_UNPARSABLE:
            raise ValueError(f"reward.judge.on_unparsable: '{config.on_unparsable}'; valid: {', '.join(ON_UNPARSABLE)}")
        if not config.scale_min < config.scale_max:
            raise ValueError(f"reward.judge: scale_min ({config.scale_min}) must be below scale_max ({config.scale_max})")
        self.complete, self.config, self.hackable = complete, config, hackable
        self.unparsable = self.position_disagreements = self.judged = 0

    def __call__(self, trajectory: Trajectory, task: Task) -> float | None:
        cfg = self.config
        try:
            if cfg.pairwise:
                reference = (task.oracle_actions or task.answers or [""])[0]
                result = pairwise(self.complete, task.question, response_of(trajectory), reference)
                self.position_disagreements += not result.consistent
                score = result.prefer_first
            else:
                rubric = cfg.rubric or DEFAULT_RUBRIC
                prompt = rubric.format(question=task.question, response=response_of(trajectory),
                                       low=cfg.scale_min, high=cfg.scale_max,
                                       reference=(task.answers or [""])[0])  # fmt: skip
                raw = parse_score(self.complete([{"role": "user", "content": prompt}]), cfg.scale_min, cfg.scale_max)
                score = (raw - cfg.scale_min) / (cfg.scale_max - cfg.scale_min)
        except JudgeParseError as err:
            self.unparsable += 1
            if cfg.on_unparsable == "error":
                raise JudgeParseError(f"task {task.id}: {err}") from None
            return None
        self.judged += 1
        return score


def openai_completion(url: str, model: str, api_key: str = "unused", max_tokens: int = 64,
                      timeout_s: float = 60.0) -> Complete:  # fmt: skip
    """A judge served over the OpenAI chat API (the official `openai` client), greedy."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key=api_key or "unused", timeout=timeout_s, max_retries=1)

    def complete(messages: list[dict[str, str]]) -> str:
        reply = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens)
        return reply.choices[0].message.content or ""

    return complete
