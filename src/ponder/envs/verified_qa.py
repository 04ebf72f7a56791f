"""Question → final answer, verified: the generic environment for a dataset of
questions with gold answers (a GSM8K-style file, a verl RL Parquet file, a TRL
prompt dataset) — the way a user trains on data they already hold.

One episode is one reply. The opening is the task's own chat (`metadata.messages`:
a verl or conversational TRL prompt, used as it is) or a system instruction and the
question; the reply ends the episode. Its answer is taken out by a chain of
extractors and compared with the gold answers (ponder.rewards.verify: pure
functions registered by name, or a user's by import path). Tasks come only from
env.train_tasks / env.eval_tasks, read with env.columns, env.transform and
env.format (ponder.envs.formats).

Reward functions written for TRL's GRPOTrainer (`(prompts, completions, **columns) ->
list[float]`) join the reward by import path (env.options.reward_funcs,
ponder.rewards.trl), as TRL adds them up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ponder.envs.base import BaseEnv, EnvContext, EnvSpec, Opening, register_env
from ponder.rewards.trl import TRLReward
from ponder.rewards.verify import COMPARATORS, EXTRACTORS, AnswerFound, VerifiedAnswer, VerifyOptions, extract
from ponder.rewards.verify import resolve as resolve_verifier
from ponder.types import Task, Turn

OPTIONS = ("extract", "compare", "gold_extract", "pattern", "field", "tolerance", "system", "template",
           "reward_funcs")  # fmt: skip
STEPS = "Solve the problem step by step, then "
# The default system message: how the first extractor of the chain wants the answer written.
INSTRUCTIONS = {
    "boxed": STEPS + "give the final answer in \\boxed{}, e.g. \\boxed{42}.",
    "gsm8k": STEPS + "write the final answer on the last line after '####', e.g. #### 42.",
    "answer_is": STEPS + 'end with "The answer is X."',
    "answer_tag": STEPS + "give the final answer in <answer></answer>, e.g. <answer>42</answer>.",
    "last_number": STEPS + "end with the final answer as a number.",
    "json": 'Reply with a JSON object whose "{field}" field holds the final answer.',
}
REWARD_WEIGHTS = {"correct": 1.0, "extracted": 0.0}


@dataclass
class VerifiedQAEnv(BaseEnv):
    """One reply per episode; its extracted answer is the turn's answer."""

    verify: VerifyOptions = field(default_factory=VerifyOptions)
    system: str = ""
    template: str = "{question}"

    def __post_init__(self) -> None:
        self.stop_strings: list[str] = []

    def reset(self, task: Task) -> Opening:
        return Opening(opening_messages(task, self.system, self.template))

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        answer = extract(action, self.verify.extract, self.verify)
        turn = Turn(0, action, answer=answer)
        return None, True, {"turn": turn, "stop_reason": "answer" if answer is not None else "done"}


def opening_messages(task: Task, system: str, template: str) -> list[dict[str, Any]]:
    """The task's own chat when it has one, else `system` (when not empty) and the
    question through `template` ({question}, {context})."""
    own = task.metadata.get("messages")
    if isinstance(own, list) and own:
        return [dict(message) for message in own]
    user = template.format(question=task.question, context=task.context or "")
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def verify_options(options: dict[str, Any]) -> VerifyOptions:
    """env.options as VerifyOptions; a misspelt option or an unknown extractor or
    comparator fails here, before anything loads."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"env.options for verified_qa: unknown {unknown}; valid: {', '.join(OPTIONS)}")
    chains = {key: _chain(options.get(key), default) for key, default in
              (("extract", VerifyOptions.extract), ("gold_extract", VerifyOptions.gold_extract))}  # fmt: skip
    verify = VerifyOptions(chains["extract"], str(options.get("compare", VerifyOptions.compare)),
                           chains["gold_extract"], str(options.get("pattern", "")),
                           str(options.get("field", VerifyOptions.field)),
                           float(options.get("tolerance", VerifyOptions.tolerance)))  # fmt: skip
    for key in ("extract", "gold_extract"):
        for name in chains[key]:
            resolve_verifier(EXTRACTORS, name, f"env.options.{key}")
    resolve_verifier(COMPARATORS, verify.compare, "env.options.compare")
    if "regex" in verify.extract + verify.gold_extract:
        if not verify.pattern:
            raise ValueError("env.options.pattern for verified_qa: the regex extractor needs a pattern")
        try:
            re.compile(verify.pattern)
        except re.error as err:
            raise ValueError(f"env.options.pattern for verified_qa: not a regular expression ({err})") from None
    if verify.tolerance < 0:
        raise ValueError(f"env.options.tolerance for verified_qa: want >= 0, got {verify.tolerance}")
    return verify


def _chain(value: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return default
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise ValueError(f"env.options for verified_qa: an extractor chain is a name or a list of names, "
                         f"got {value!r}")  # fmt: skip
    return tuple(names)


def default_system(verify: VerifyOptions) -> str:
    """The instruction for the first extractor of the chain ("" when it has none)."""
    return INSTRUCTIONS.get(verify.extract[0], "").replace("{field}", verify.field)


def trl_rewards(paths: Any) -> dict[str, TRLReward]:
    """env.options.reward_funcs (import paths) as components named like the functions."""
    if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
        raise ValueError(f"env.options.reward_funcs for verified_qa: want a list of 'module:function', got {paths!r}")
    rewards: dict[str, TRLReward] = {}
    for path in paths:
        reward = TRLReward(path)
        name = reward.name
        if name in rewards or name in REWARD_WEIGHTS:
            raise ValueError(f"env.options.reward_funcs: two reward components named {name!r} ({path})")
        rewards[name] = reward
    return rewards


@register_env("verified_qa")
def build_verified_qa(ctx: EnvContext) -> EnvSpec:
    """Question → final answer, from env.train_tasks / env.eval_tasks.

    env.options (all optional):
      extract: an extractor or a chain of them, tried in order on the reply:
        boxed, gsm8k (`#### 42`), answer_is, answer_tag, last_number, regex, json,
        whole, or `module:function` ((text, options) -> str | None)
        ([boxed, gsm8k, answer_is, last_number]).
      compare: exact, numeric, normalized, auto (numeric for two numbers, else
        normalized), or `module:function` ((predicted, gold, options) -> bool) (auto).
      gold_extract: the chain applied to each gold answer first (whole: as written;
        gsm8k for a GSM8K solution column ending `#### 42`).
      pattern: the regex extractor's pattern (its group `answer`, else group 1).
      field: the json extractor's field, `a.b` for a nested one (answer).
      tolerance: numeric's tolerance relative to max(1, |gold|) (1e-6; 0 = exact).
      system: the system message; `auto` (the default): the first extractor's own
        instruction; "" for none. A task with its own chat (verl, TRL
        conversational) opens with that instead.
      template: the user message, with {question} and {context} ({question}).
      reward_funcs: TRL-signature reward functions by import path, each a component
        named like its function, weight 1 (TRL sums them); `correct` then weighs 0.
    Reward components: correct (1 when the reply's answer matches a gold answer, else
    0; none for a task without gold answers) and extracted (1 when the chain finds an
    answer), default weights 1.0 and 0.0, changed with reward.terms."""
    recipe = ctx.recipe
    if recipe is not None and not (recipe.env.train_tasks or recipe.env.eval_tasks):
        raise ValueError("env.kind verified_qa: give env.train_tasks and/or env.eval_tasks (JSONL, Parquet, a "
                         "datasets directory or hf:NAME[:CONFIG]:SPLIT)")  # fmt: skip
    options = dict(ctx.options)
    verify = verify_options(options)
    system = options.get("system", "auto")
    system = default_system(verify) if system == "auto" else str(system)
    template = str(options.get("template", "{question}"))
    try:
        template.format(question="", context="")
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"env.options.template for verified_qa: only {{question}} and {{context}} may be filled "
                         f"in, got {template!r}") from None  # fmt: skip
    if "{question}" not in template:
        raise ValueError(f"env.options.template for verified_qa: want {{question}} in it, got {template!r}")
    rewards: dict[str, Any] = {"correct": VerifiedAnswer(verify), "extracted": AnswerFound(verify)}
    weights = dict(REWARD_WEIGHTS)
    if options.get("reward_funcs"):
        funcs = trl_rewards(options["reward_funcs"])
        rewards.update(funcs)
        weights = {"correct": 0.0, "extracted": 0.0, **dict.fromkeys(funcs, 1.0)}
    return EnvSpec(lambda: VerifiedQAEnv(verify, system, template), [], [], rewards, weights)
