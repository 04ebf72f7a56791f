"""Math word problems with verifiable rewards: the model thinks, may call a calculator
(`<calculator>12*7+3</calculator>`, the value comes back as `<result>87</result>`), and
ends with `<answer>87</answer>`, checked exactly against the gold answer.

Tasks are generated offline and seeded (ponder.envs.math_tasks); answers are
extracted and verified by ponder.rewards.math. The tool step is the shared one
(parse → validate → call → observe) with the Search-R1 tag parser retargeted to the
calculator, and the calculator is the built-in one (syntax-tree evaluation, bounded
exponents and integer sizes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ponder.envs.base import EnvContext, EnvSpec, Opening, register_env
from ponder.envs.math_tasks import CALCULATOR_FROM_LEVEL, LEVELS, math_splits
from ponder.envs.math_variants import TRAIN_VARIANTS, VARIANTS, lure_taken, training_tasks, variant_tasks
from ponder.rewards.math import answer_format, calculator_calls, contains_answer, correct, verbosity
from ponder.rewards.process import process, process_rewards
from ponder.tools import ToolRegistry, run_tool_step
from ponder.tools.step import RepeatedCalls
from ponder.tools.builtin import calculator
from ponder.tools.parsers import SearchR1Parser
from ponder.types import Task, Turn

WITH_CALCULATOR = (
    "Solve the math problem. Think step by step in <think></think>. To compute, write "
    "<calculator>expression</calculator>, e.g. <calculator>12*7+3</calculator>; the value comes back "
    "in <result></result>. Give the final answer as a number in <answer></answer>, e.g. <answer>87</answer>."
)
WITHOUT_CALCULATOR = (
    "Solve the math problem. Think step by step in <think></think>. "
    "Give the final answer as a number in <answer></answer>, e.g. <answer>87</answer>."
)
# Correctness is the reward; the small format bonus keeps answers in the tag that
# ends generation. Calculator calls are counted but free by default: the reference
# solver uses it on levels 3-4, and a cost would put the ceiling below 1 + format.
# The process reward (PRM, ponder.rewards.process) is off (ORM alone) but logged, so
# an outcome-only run can be compared with one that pays for it; lure_taken (the answer
# is the bait or distractor number of an adversarial task) is only ever logged.
REWARD_WEIGHTS = {"correct": 1.0, "format": 0.1, "calc_cost": 0.0, "process": 0.0, "lure_taken": 0.0,
                  "contains_answer": 0.0, "verbosity": 0.0}
OPTIONS = ("seed", "n_train", "n_eval", "difficulties", "mix", "calculator", "calculator_from", "max_turns",
           "variant", "train_variants", "max_repeated_calls")  # fmt: skip


def math_parser(calculator_on: bool) -> SearchR1Parser:
    """`<think>…</think>`, `<calculator>expr</calculator>` or `<answer>…</answer>` (the
    last tag is the action), results in `<result>`: the Search-R1 parser with the
    calculator in place of search. Without the calculator only `<answer>` is an
    action, so a `<calculator>` tag is a protocol error the model is told about."""
    compute = "compute with <calculator>expression</calculator> or " if calculator_on else ""
    return SearchR1Parser("calculator", "expression", "calculator" if calculator_on else None, "result",
                          how=f"{compute}answer with <answer>number</answer>")  # fmt: skip


def build_messages(task: Task, calculator_on: bool) -> list[dict[str, str]]:
    """The system rules (with or without the calculator) and the problem."""
    rules = WITH_CALCULATOR if calculator_on else WITHOUT_CALCULATOR
    return [{"role": "system", "content": rules}, {"role": "user", "content": task.question}]


@dataclass
class MathEnv:
    """One episode: calculator calls until an `<answer>` or max_turns actions."""

    calculator_on: bool = True
    max_turns: int = 3
    calculator_tool: Any = None  # a calculator served from elsewhere (MCP); None = the built-in
    # Each turn's reward is process_weight x its process score (reward.terms.process):
    # the turn-level advantage reads it there. 0 = no per-turn reward (outcome only).
    process_weight: float = 0.0
    # An identical calculator call made this many times ends the episode, unrun (0 = never).
    max_repeated_calls: int = 0

    def __post_init__(self) -> None:
        self.parser = math_parser(self.calculator_on)
        self.stop_strings = list(self.parser.stop_strings)
        tool = self.calculator_tool or calculator
        self.registry = ToolRegistry([tool] if self.calculator_on else [])
        self.turn_index = 0
        self.turns: list[Turn] = []
        self.repeats = RepeatedCalls(self.max_repeated_calls)

    def reset(self, task: Task) -> Opening:
        self.turn_index = 0
        self.turns = []
        self.repeats = RepeatedCalls(self.max_repeated_calls)
        return Opening(build_messages(task, self.calculator_on), self.registry.specs())

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        outcome = run_tool_step(action, self.parser, self.registry, repeats=self.repeats)
        turn = outcome.turn(self.turn_index, action)
        self.turn_index += 1
        self.turns.append(turn)
        info: dict[str, Any] = {"turn": turn}
        if self.process_weight:  # the episode's turns so far: a turn may use earlier calculator results
            info["reward"] = self.process_weight * process_rewards(self.turns)[-1]
        if outcome.parse.answer is not None:
            return None, True, {**info, "stop_reason": "answer"}
        if outcome.stopped is not None:  # a call loop: say why on the turn, count it for the metrics
            turn.error = outcome.observation
            return outcome.observation, True, {**info, "stop_reason": outcome.stopped,
                                               "metrics": {"repeated_call_stop": 1.0}}  # fmt: skip
        if self.turn_index >= self.max_turns:
            return None, True, {**info, "stop_reason": "max_turns"}
        turn.observation = outcome.observation
        return outcome.observation, False, info


def math_options(options: dict[str, Any], default_max_turns: int = 3) -> dict[str, Any]:
    """env.options with defaults filled in; a misspelt or out-of-range option fails here."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"env.options for math: unknown {unknown}; valid: {', '.join(OPTIONS)}")
    merged = {"seed": 0, "n_train": 512, "n_eval": 128, "difficulties": list(LEVELS), "mix": None,
              "calculator": True, "calculator_from": CALCULATOR_FROM_LEVEL, "max_turns": default_max_turns,
              "variant": "none", "train_variants": ["none"], "max_repeated_calls": 0, **options}  # fmt: skip
    if merged["variant"] not in VARIANTS:
        raise ValueError(f"env.options.variant for math: want one of {', '.join(VARIANTS)}, "
                         f"got {merged['variant']!r}")  # fmt: skip
    drawn = merged["train_variants"]
    if not isinstance(drawn, list) or not drawn or any(v not in TRAIN_VARIANTS for v in drawn):
        raise ValueError(f"env.options.train_variants for math: want a list of {', '.join(TRAIN_VARIANTS)}, "
                         f"got {drawn!r}")  # fmt: skip
    for key in ("n_train", "n_eval", "max_turns", "calculator_from", "max_repeated_calls"):
        if not isinstance(merged[key], int) or merged[key] < (1 if key == "max_turns" else 0):
            raise ValueError(f"env.options.{key} for math: want a whole number >= {int(key == 'max_turns')}, "
                             f"got {merged[key]!r}")  # fmt: skip
    mix = merged["mix"]
    if mix is not None and (len(mix) != len(merged["difficulties"]) or min(mix) < 0 or sum(mix) <= 0):
        raise ValueError(f"env.options.mix for math: want one weight >= 0 per difficulty "
                         f"({merged['difficulties']}), not all 0; got {mix!r}")  # fmt: skip
    return merged


@register_env("math")
def build_math(ctx: EnvContext) -> EnvSpec:
    """Arithmetic and algebra word problems with exact answers (ponder.envs.math_tasks).

    env.options (all optional):
      seed: task generator seed (0).
      n_train / n_eval: tasks per split (512 / 128); no question is in both splits.
      difficulties: levels to draw, from 1 (one operation) to 4 (a linear equation)
        ([1, 2, 3, 4]); the task kind is `level{n}`.
      mix: one weight per entry of difficulties (equal weights).
      calculator: offer the `<calculator>` tool (true).
      calculator_from: the level from which the reference solver (the SFT teacher)
        hands its last step to the calculator (3; 1 = on every problem).
      max_turns: actions per episode (the recipe's env.max_turns).
      variant: the evaluation split as it is (`none`) or its adversarial twin
        (ponder.envs.math_variants): `ood` (rephrased in templates and words training
        never uses), `distractor` (an irrelevant number added), `bait` (a wrong
        "the answer is probably N" added), `far` (another setting, sentence shape
        and wording: a bakery, a timetable, money in cents; the question first,
        the passive; numbers in words, units, some with an irrelevant number). The
        same held-out problems and answers; the training split never changes.
      train_variants: the variants training tasks are told in, one drawn per task
        (seeded) from the list: `none`, `ood`, `far` ([none]: as generated). `far`
        in training uses phrasings the `far` evaluation never does, and no training
        question equals an evaluation question of any variant.
      max_repeated_calls: an episode that makes the same calculator call (same
        expression up to spaces) this many times ends there, that call not run;
        its stop reason is `repeated_call` (0: never, the default).
    A `calculator` from env.mcp_servers (taking `expression`) replaces the built-in one.
    Reward components: correct (1 / 0, exact), format (the answer as one number in
    `<answer>`, no protocol errors), calc_cost (calculator calls), process (the
    per-turn process scores summed, ponder.rewards.process), lure_taken (1 when the
    answer is the task's bait or distractor number; none on other tasks),
    contains_answer (1 when any number of the answer is right) and verbosity (a
    length-biased judge: min(1, words written / 50)), the last two hackable by design
    for reward-hacking experiments; default weights 1.0, 0.1, 0.0, 0.0, 0.0, 0.0 and
    0.0, changed with reward.terms. A nonzero
    `process` weight also makes each turn's reward weight x its score, for
    `algo.advantage: turn` (outcome + process = PRM; weight 0 = ORM)."""
    default_turns = ctx.recipe.env.max_turns if ctx.recipe is not None else 3
    options = math_options(dict(ctx.options), default_turns)
    seed, levels, mix = options["seed"], options["difficulties"], options["mix"]
    solver = (options["calculator"], options["calculator_from"])
    train, evaluation = math_splits(seed, options["n_train"], options["n_eval"], levels, mix, *solver)
    if options["train_variants"] != ["none"]:  # the same training problems, told in several ways
        train = training_tasks(options["train_variants"], seed, options["n_train"], options["n_eval"], levels, mix,
                               *solver)  # fmt: skip
    if options["variant"] != "none":  # the same held-out problems, made adversarial
        evaluation = variant_tasks(options["variant"], seed, options["n_eval"], levels, mix, *solver)
    calculator_on, max_turns = bool(options["calculator"]), options["max_turns"]
    served = ctx.served_tool("calculator") if calculator_on else None
    if served is not None and "expression" not in served.spec.parameters.get("properties", {}):
        raise ValueError("env.mcp_servers: the served 'calculator' takes no `expression` argument, "
                         "which <calculator>…</calculator> fills")  # fmt: skip
    rewards = {"correct": correct, "format": answer_format, "calc_cost": calculator_calls, "process": process,
               "lure_taken": lure_taken, "contains_answer": contains_answer,
               "verbosity": verbosity}  # fmt: skip
    # the per-turn rewards must add up to what the composite charges for `process`
    terms = dict(ctx.recipe.reward.terms) if ctx.recipe is not None else {}
    process_weight = float(terms.get("process", REWARD_WEIGHTS["process"]))
    repeats = options["max_repeated_calls"]
    factory = lambda: MathEnv(calculator_on, max_turns, served, process_weight, repeats)  # a fresh episode per call
    return EnvSpec(factory, train, evaluation, rewards, dict(REWARD_WEIGHTS))
