"""Trajectory-level scoring beside outcome scoring: was each step of an episode sound,
not only its final answer?

Each turn (a step) is judged by the registered step checks (STEP_CHECKS), pure
functions `(trajectory, task, options) -> one verdict per turn`: the tuple of problems
found in that turn (empty: the step passes the check) or None (the check does not
apply to it). The built-in checks:

- `process`: the arithmetic the turn shows (`expression = value` outside
  `<calculator>`, ponder.rewards.process, the math env's per-turn process score) holds
  no false step, i.e. its process score is 1. Applies to turns that claim a step or
  restate an earlier calculator result. Problem: `false_step`.
- `tool_use`: each call of the turn names a tool that exists (and that was offered,
  where the turn records what was offered), its arguments validate, the tool returned
  no error, and it is not the identical call (ponder.tools.step.call_key) made just
  before it. Applies to turns with calls. Problems: `unknown_tool`, `not_offered`,
  `bad_arguments`, `tool_error`, `call_cap` (past the calls allowed per action),
  `repeated_call`.
- `policy`: the turn broke no rule: `protocol_error` (the parser's: no tag, an
  unclosed or empty one), `format_gaming` (an empty protocol tag), `repetition` (the
  action loops: repeated word 4-grams), `needs_approval` (a call of a tool that needs
  the user's approval), `refused` (a call the safety guard refused); on the answering
  turn the answer's hacking detectors (ponder.rewards.hacking) `answer_guessing` (needs
  the task) and `answer_hedging`; on the last turn `truncated` (the token cap).
  Applies to every turn.

Without the tools' schemas (ScoringOptions.tools) a call's existence and arguments are
read from what the tool registry answered (its `unknown tool` and argument messages).

A step is good when every check that applies passes; its score is the share of the
applicable checks it passes (1 when none applies). An episode (EpisodeScore) has a
step_score (the share of its good steps), worst_step (its lowest step score),
first_bad (the index of its first bad step) and is clean when every step is good. Over
an evaluation (trajectory_summary): the mean step score and its standard error, the
share of clean episodes, problem counts, and outcome against trajectory: right_flawed
(right answer, some bad step: right for the wrong reasons), wrong_clean (wrong answer
from sound steps) and their agreement.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from ponder.registry import Registry
from ponder.rewards.hacking import answer_guessing, answer_hedging, format_gaming, repeated_ngram_ratio, truncated
from ponder.rewards.process import episode_steps
from ponder.tools.step import REPEATED_CALL, call_key
from ponder.types import Task, ToolCall, ToolResult, ToolSpec, Trajectory, Turn

Verdict = tuple[str, ...] | None  # the problems of one turn under one check; None: not applicable
StepCheck = Callable[[Trajectory, Task | None, "ScoringOptions"], list[Verdict]]
STEP_CHECKS: Registry[StepCheck] = Registry("step check")

# The reward component that says whether the outcome was right, the first one present:
# math's `correct`, QA's `em`, code's `all_pass`, function calling's `bfcl`, agent `completion`.
OUTCOME_COMPONENTS = ("correct", "em", "all_pass", "bfcl", "completion")
APPROVAL_TOOLS = ("python",)  # what `ponder chat` asks approval for unless --allow-risky
_UNKNOWN = re.compile(r"unknown tool '")
_BAD_ARGUMENTS = re.compile(r"[^:\n]+: (arguments?\b|missing required argument|unexpected argument)")
_STOPPED = "not run: stopped:"  # ponder.tools.step: a call loop ended the episode
_OVER_CAP = "not run: at most"  # ponder.tools.step: past max_calls_per_action
_REFUSED = "refused: "  # ponder.tools.safety.guard


@dataclass(frozen=True)
class ScoringOptions:
    """How steps are judged.

    checks: the registered step checks to run, in order.
    tools: name -> ToolSpec of the tools the episode could call; None: judge existence
        and arguments from the registry's recorded answers.
    needs_approval: tools whose every call is a policy violation (they need a person's approval).
    repetition_n / repetition_threshold: an action whose repeated word-n-gram ratio is at
        least the threshold loops (ponder.rewards.hacking's defaults).
    """

    checks: tuple[str, ...] = ("process", "tool_use", "policy")
    tools: Mapping[str, ToolSpec] | None = None
    needs_approval: tuple[str, ...] = APPROVAL_TOOLS
    repetition_n: int = 4
    repetition_threshold: float = 0.5


@dataclass(frozen=True)
class StepJudgement:
    """One turn's verdicts: check name -> its problems (empty: passed) or None (not applicable)."""

    index: int
    verdicts: dict[str, Verdict]

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(problem for verdict in self.verdicts.values() for problem in verdict or ())

    @property
    def good(self) -> bool:
        return not self.problems

    @property
    def score(self) -> float:
        """The share of the applicable checks this step passes; 1.0 when none applies."""
        applicable = [verdict for verdict in self.verdicts.values() if verdict is not None]
        return sum(not verdict for verdict in applicable) / len(applicable) if applicable else 1.0


@dataclass(frozen=True)
class EpisodeScore:
    """One episode's steps, aggregated.

    steps / good_steps: turns judged and those every applicable check passed.
    worst_step: the lowest step score (nan with no steps). first_bad: the index of
    the first bad step, None when there is none. problems: `check/problem` -> occurrences.
    checks: check -> (steps it applied to, steps that passed it). outcome: whether
    the outcome was right (outcome_correct), None when the breakdown does not say.
    """

    steps: int
    good_steps: int
    worst_step: float
    first_bad: int | None
    problems: dict[str, int] = field(default_factory=dict)
    checks: dict[str, tuple[int, int]] = field(default_factory=dict)
    outcome: bool | None = None

    @property
    def step_score(self) -> float:
        """The share of good steps; nan for an episode without turns."""
        return self.good_steps / self.steps if self.steps else float("nan")

    @property
    def clean(self) -> bool:
        return self.steps > 0 and self.good_steps == self.steps


def judge_steps(trajectory: Trajectory, task: Task | None = None,
                options: ScoringOptions | None = None) -> list[StepJudgement]:  # fmt: skip
    """Every turn of `trajectory` under each of options.checks. `task` (its gold answers)
    is needed only by the answer-guessing detector, left out without it."""
    options = options or ScoringOptions()
    verdicts: dict[str, list[Verdict]] = {}
    for name in options.checks:
        verdicts[name] = STEP_CHECKS.get(name, "trajectory scoring")(trajectory, task, options)
        if len(verdicts[name]) != len(trajectory.turns):
            raise ValueError(f"step check '{name}' gave {len(verdicts[name])} verdicts for "
                             f"{len(trajectory.turns)} turns")  # fmt: skip
    return [StepJudgement(turn.index, {name: verdicts[name][position] for name in options.checks})
            for position, turn in enumerate(trajectory.turns)]  # fmt: skip


def aggregate_steps(judgements: Sequence[StepJudgement], outcome: bool | None = None) -> EpisodeScore:
    """The episode's step score, worst step, first bad step, problem and check counts."""
    problems = Counter(f"{name}/{problem}" for step in judgements for name, verdict in step.verdicts.items()
                       for problem in verdict or ())  # fmt: skip
    checks: dict[str, tuple[int, int]] = {}
    for step in judgements:
        for name, verdict in step.verdicts.items():
            applied, passed = checks.get(name, (0, 0))
            checks[name] = (applied + (verdict is not None), passed + (verdict is not None and not verdict))
    first_bad = next((step.index for step in judgements if not step.good), None)
    worst = min((step.score for step in judgements), default=float("nan"))
    good = sum(step.good for step in judgements)
    return EpisodeScore(len(judgements), good, worst, first_bad, dict(sorted(problems.items())), checks, outcome)


def outcome_correct(trajectory: Trajectory) -> bool | None:
    """Whether the outcome was right: the first of OUTCOME_COMPONENTS in the breakdown
    is at least 0.5; None when the breakdown has none of them."""
    for name in OUTCOME_COMPONENTS:
        value = trajectory.breakdown.get(name)
        if isinstance(value, (int, float)) and not math.isnan(value):
            return value >= 0.5
    return None


def score_episode(trajectory: Trajectory, task: Task | None = None,
                  options: ScoringOptions | None = None) -> EpisodeScore:  # fmt: skip
    """judge_steps, aggregated, with the episode's outcome."""
    return aggregate_steps(judge_steps(trajectory, task, options), outcome_correct(trajectory))


def trajectory_summary(scores: Sequence[EpisodeScore]) -> dict[str, Any]:
    """Over episodes (those without turns left out): the mean step score and its
    standard error, the shares of clean episodes and bad steps, the mean worst step,
    the mean first bad index (of flawed episodes), problem counts, each check's pass
    rate, and outcome against trajectory (`outcome`: counts right_clean, right_flawed,
    wrong_clean, wrong_flawed, unknown; agreement, the share of episodes with a known
    outcome whose answer is right exactly when every step is good). Sums are exact
    (math.fsum), so the order of the episodes changes nothing."""
    scored = [score for score in scores if score.steps]
    steps = sum(score.steps for score in scored)
    flawed = [score.first_bad for score in scored if score.first_bad is not None]
    checks: dict[str, list[int]] = {}
    for score in scored:
        for name, (applied, passed) in score.checks.items():
            checks.setdefault(name, [0, 0])
            checks[name][0] += applied
            checks[name][1] += passed
    step_scores = [score.step_score for score in scored]
    return {
        "episodes": len(scored),
        "step_score": _mean(step_scores),
        "step_score_se": _standard_error(step_scores),
        "clean": _mean([float(score.clean) for score in scored]),
        "bad_steps": sum(score.steps - score.good_steps for score in scored) / steps if steps else float("nan"),
        "worst_step": _mean([score.worst_step for score in scored]),
        "first_bad": _mean([float(index) for index in flawed]),
        "problems": dict(sorted(sum((Counter(score.problems) for score in scored), Counter()).items())),
        "checks": {name: passed / applied if applied else float("nan")
                   for name, (applied, passed) in sorted(checks.items())},  # fmt: skip
        "outcome": outcome_agreement(scored),
    }


def outcome_agreement(scores: Sequence[EpisodeScore]) -> dict[str, Any]:
    """Counts of (outcome right / wrong) x (every step good / some bad), `unknown`
    (no outcome component), and agreement: (right_clean + wrong_flawed) / known."""
    counts = Counter(
        "unknown" if score.outcome is None
        else ("right" if score.outcome else "wrong") + ("_clean" if score.clean else "_flawed")
        for score in scores
    )  # fmt: skip
    keys = ("right_clean", "right_flawed", "wrong_clean", "wrong_flawed", "unknown")
    known = len(scores) - counts["unknown"]
    agree = counts["right_clean"] + counts["wrong_flawed"]
    return {**{key: counts[key] for key in keys}, "agreement": agree / known if known else float("nan")}


def score_evaluation(trajectories: Sequence[Trajectory], tasks_by_id: Mapping[str, Task],
                     options: ScoringOptions | None = None) -> dict[str, Any]:  # fmt: skip
    """trajectory_summary of every episode, each judged with its task."""
    return trajectory_summary([score_episode(t, tasks_by_id.get(t.task_id), options) for t in trajectories])


@STEP_CHECKS.register("process")
def process_check(trajectory: Trajectory, task: Task | None, options: ScoringOptions) -> list[Verdict]:
    """`false_step` once per false shown step; None for a turn that claims nothing."""
    verdicts: list[Verdict] = []
    for steps in episode_steps(trajectory.turns):
        claims = steps.true + steps.false + steps.used
        verdicts.append(None if claims == 0 else ("false_step",) * steps.false)
    return verdicts


@STEP_CHECKS.register("tool_use")
def tool_use_check(trajectory: Trajectory, task: Task | None, options: ScoringOptions) -> list[Verdict]:
    """Per turn with calls, each call's problems (call_problems); None for a turn without calls."""
    verdicts: list[Verdict] = []
    previous: str | None = None
    for turn in trajectory.turns:
        if not turn.tool_calls:
            verdicts.append(None)
            continue
        problems: list[str] = []
        for position, call in enumerate(turn.tool_calls):
            result = turn.tool_results[position] if position < len(turn.tool_results) else None
            problems += call_problems(call, result, turn, options.tools, previous)
            previous = call_key(call)
        verdicts.append(tuple(problems))
    return verdicts


def call_problems(call: ToolCall, result: ToolResult | None, turn: Turn,
                  tools: Mapping[str, ToolSpec] | None, previous: str | None) -> list[str]:  # fmt: skip
    """What is wrong with one call: the tool does not exist or was not offered, its
    arguments do not validate, it failed, or it repeats the call just before it."""
    problems = []
    error = result.content if result is not None and result.is_error else None
    unknown = call.name not in tools if tools is not None else bool(error and _UNKNOWN.match(error))
    if unknown:
        problems.append("unknown_tool")
    elif turn.offered_tools and call.name not in turn.offered_tools:
        problems.append("not_offered")
    bad_arguments = not unknown and _bad_arguments(call, error, tools)
    if bad_arguments:
        problems.append("bad_arguments")
    if error is not None and not (unknown or bad_arguments):
        if error.startswith(_STOPPED):
            problems.append("repeated_call")
        elif not error.startswith(_REFUSED):  # a refusal is the policy check's
            problems.append("call_cap" if error.startswith(_OVER_CAP) else "tool_error")
    if previous is not None and call_key(call) == previous and "repeated_call" not in problems:
        problems.append("repeated_call")
    return problems


def _bad_arguments(call: ToolCall, error: str | None, tools: Mapping[str, ToolSpec] | None) -> bool:
    if tools is None:
        return bool(error and _BAD_ARGUMENTS.match(error) and error.startswith(f"{call.name}: "))
    validator = jsonschema.Draft202012Validator(tools[call.name].parameters)
    return not validator.is_valid(call.arguments)


@STEP_CHECKS.register("policy")
def policy_check(trajectory: Trajectory, task: Task | None, options: ScoringOptions) -> list[Verdict]:
    """Per turn: protocol errors, an empty protocol tag, a looping action, calls that
    need approval or that the guard refused; the answer's detectors on the answering
    turn, truncation on the last."""
    answering = max((i for i, turn in enumerate(trajectory.turns) if turn.answer is not None), default=None)
    verdicts: list[Verdict] = []
    for position, turn in enumerate(trajectory.turns):
        alone = Trajectory(trajectory.task_id, [], turns=[turn])
        problems = []
        if turn.error is not None and not _ended_for_repeats(trajectory, position):
            problems.append("protocol_error")
        if format_gaming(alone):
            problems.append("format_gaming")
        if repeated_ngram_ratio(turn.action, options.repetition_n) >= options.repetition_threshold:
            problems.append("repetition")
        problems += ["needs_approval" for call in turn.tool_calls if call.name in options.needs_approval]
        problems += ["refused" for result in turn.tool_results if result.is_error and
                     result.content.startswith(_REFUSED)]  # fmt: skip
        if position == answering:
            problems += _answer_flags(trajectory, task)
        if position == len(trajectory.turns) - 1 and truncated(trajectory):
            problems.append("truncated")
        verdicts.append(tuple(problems))
    return verdicts


def _ended_for_repeats(trajectory: Trajectory, position: int) -> bool:
    """The last turn's error is the notice of a call loop (the tool check counts it)."""
    return trajectory.stop_reason == REPEATED_CALL and position == len(trajectory.turns) - 1


def _answer_flags(trajectory: Trajectory, task: Task | None) -> list[str]:
    flags = ["answer_hedging"] if answer_hedging(trajectory) else []
    if task is not None and answer_guessing(trajectory, task):
        flags.insert(0, "answer_guessing")
    return flags


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else float("nan")


def _standard_error(values: Sequence[float]) -> float:
    """Sample standard deviation / sqrt(n); nan below two values."""
    if len(values) < 2:
        return float("nan")
    centre = _mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / (len(values) - 1) / len(values))
