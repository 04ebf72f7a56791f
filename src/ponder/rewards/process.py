"""A process reward (PRM) for multi-step math: credit per turn for the arithmetic the
policy shows, next to the outcome reward (ORM, `correct`) paid at the end.

Each turn's claims are checked, not judged by a model: a claimed step is a shown
`expression = value` (ponder.rewards.hacking.shown_steps, outside `<calculator>`
tags), true when the expression evaluates to the value exactly; a calculator result
the turn uses is a distinct value returned by a calculator call of an EARLIER turn
that this turn writes again (as an operand or the answer; a true step's own result is
credited once, as the step), always true.
A turn's score is

    (true + used − false_penalty · false) / (true + false + used),  0 when it claims nothing,

so in [−false_penalty, 1]: the fraction of its claims that are true, each false step
taking one true step's credit back (false_penalty = 1). Whether a step lies on a path
to the answer is not checked: "1 + 1 = 2" earns as much as a useful step. That is
the simple, documented rule and its limit (a policy can pad turns with trivial true
steps; the score is per turn, so at most 1 per turn and max_turns per episode).

The environment gives weight · score as each turn's reward (Turn.reward, the channel
search-QA's per-search cost uses), so the `turn` advantage estimator credits each turn
with its own steps; the component `process` (the sum over turns) puts the same amount
into the episode total, which the outcome estimators (grpo, rloo) see as a whole.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ponder.rewards.hacking import shown_steps
from ponder.rewards.math import _NUMBER, _value
from ponder.types import Task, Trajectory, Turn

_CALCULATOR_CALL = re.compile(r"<calculator>(.*?)</calculator>", re.DOTALL)
FALSE_STEP_PENALTY = 1.0  # one false step cancels one true one


@dataclass(frozen=True)
class TurnSteps:
    """What one turn claims: true and false shown steps, and earlier calculator
    results it writes again (`used`)."""

    true: int = 0
    false: int = 0
    used: int = 0


def calculator_values(turn: Turn) -> set[Fraction]:
    """The values the turn's successful calculator calls returned (the last number of
    each result, as ponder.rewards.hacking.math_work reads them)."""
    values: set[Fraction] = set()
    for call, result in zip(turn.tool_calls, turn.tool_results):
        if call.name == "calculator" and not result.is_error:
            numbers = [_value(m) for m in _NUMBER.finditer(result.content)]
            values.update(v for v in numbers[-1:] if v is not None)
    return values


def turn_steps(action: str, earlier_results: Collection[Fraction]) -> TurnSteps:
    """Count the claims of one action. Steps inside `<calculator>` are the tool's input,
    not claims; a number there still counts as using an earlier result."""
    claims = shown_steps(_CALCULATOR_CALL.sub(" ", action))
    reached = {claimed for _, claimed, ok in claims if ok and claimed is not None}
    true = sum(1 for _, claimed, ok in claims if ok and claimed is not None)
    written = {value for value in (_value(m) for m in _NUMBER.finditer(action)) if value is not None}
    # a true step that restates a calculator result is credited once, as the step
    used = (written & set(earlier_results)) - reached
    return TurnSteps(true, len(claims) - true, len(used))


def process_score(steps: TurnSteps, false_penalty: float = FALSE_STEP_PENALTY) -> float:
    """(true + used − false_penalty·false) / (true + false + used); 0.0 for no claims."""
    claims = steps.true + steps.false + steps.used
    if claims == 0:
        return 0.0
    return (steps.true + steps.used - false_penalty * steps.false) / claims


def episode_steps(turns: Sequence[Turn]) -> list[TurnSteps]:
    """What each turn claims, in order; a turn may use the calculator results of the
    turns before it (never its own: it wrote the call before it saw the result)."""
    earlier: set[Fraction] = set()
    steps = []
    for turn in turns:
        steps.append(turn_steps(turn.action, earlier))
        earlier |= calculator_values(turn)
    return steps


def process_rewards(turns: Sequence[Turn], false_penalty: float = FALSE_STEP_PENALTY) -> list[float]:
    """One process score per turn, in order (episode_steps, scored by process_score)."""
    return [process_score(steps, false_penalty) for steps in episode_steps(turns)]


def process(trajectory: Trajectory, task: Task) -> float:
    """Reward component `process`: the sum of the episode's per-turn process scores
    (what the environment paid turn by turn, before the weight)."""
    return float(sum(process_rewards(trajectory.turns)))
