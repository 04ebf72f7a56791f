"""Every registered environment (and the example one) keeps the Env protocol:
splits, openings, hostile actions, and an oracle that scores above a wrong answer."""

from __future__ import annotations

import math

import pytest

from ponder.config import EnvConfig, Recipe, RolloutConfig, SamplingConfig
from ponder.envs.base import ENVS, Env, _load_builtin_envs, opening_of
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.types import ToolSpec
from ponder.wiring import build_env, build_reward

_load_builtin_envs()
# an environment a program drives (env.kind gateway) has no step: tests/serve/test_gateway.py
KINDS = sorted(kind for kind in ENVS if ENVS.trait(kind, "stepped")) + ["examples.guess_number.env:build"]
HOSTILE = [
    "",
    "</tool_response><tool_call>{\"name\": \"x\"",
    "<answer></answer>" * 50,
    "\udcff lone surrogate \x00 nul",
    "{" * 5000,
]


def _gsm8k_style_env(directory) -> EnvConfig:
    """verified_qa takes its tasks only from files: GSM8K-style ones from ponder's problems."""
    import json

    from ponder.envs.math_tasks import generate_problems, gsm8k_row

    for split, seed in (("train", 0), ("eval", 1)):
        rows = [gsm8k_row(problem) for problem in generate_problems(seed, 6, [1, 2, 3, 4], None)]
        (directory / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return EnvConfig(kind="verified_qa", train_tasks=str(directory / "train.jsonl"),
                     eval_tasks=str(directory / "eval.jsonl"), columns={"answers": "answer", "oracle_actions": "answer"},
                     options={"extract": "gsm8k", "gold_extract": "gsm8k"})  # fmt: skip


# The shared-format adapters wrap an environment of their format: the ones of examples/envs,
# written with each format's own SDK (their reference solutions from a dataset column, and
# from the OpenEnv server's task specs).
ADAPTED = {
    "verifiers": ("verifiers", {"env_id": "examples.envs.verifiers_arith", "oracle": "<answer>{answer}</answer>"}),
    "openenv": ("openenv", {"command": ["{python}", "-m", "examples.envs.openenv_guess", "--port", "{port}"],
                            "oracle_key": "solution", "stop": ["</guess>"]}),
}  # fmt: skip


@pytest.fixture(scope="module", params=KINDS)
def built(request, tmp_path_factory):
    if request.param == "function_calling":
        from ponder.bfcl.bridge import bfcl_python

        if not bfcl_python().exists():
            pytest.skip("BFCL's venv is missing: make bfcl-venv")
    if request.param == "verified_qa":
        recipe = Recipe(env=_gsm8k_style_env(tmp_path_factory.mktemp("gsm8k_style")))
    elif request.param in ADAPTED:
        sdk, options = ADAPTED[request.param]
        pytest.importorskip(sdk)
        recipe = Recipe(env=EnvConfig(kind=request.param, options=options))
    else:
        recipe = Recipe(env=EnvConfig(kind=request.param))
    tokenizer = tiny_tokenizer()
    spec = build_env(recipe, tokenizer)
    yield recipe, spec, tokenizer
    spec.close()


def test_splits_are_non_empty_and_disjoint(built):
    _, spec, _ = built
    assert spec.train and spec.eval
    assert not {t.id for t in spec.train} & {t.id for t in spec.eval}
    assert all(task.oracle_actions for task in spec.eval[:5]), "the reference solver gives every task a solution"


def test_reset_gives_chat_messages_and_tool_specs(built):
    _, spec, _ = built
    env = spec.factory()
    assert isinstance(env, Env)
    assert all(isinstance(s, str) for s in env.stop_strings)
    opening = opening_of(env.reset(spec.eval[0]))
    assert opening.messages and all(isinstance(m["role"], str) and isinstance(m["content"], str)
                                    for m in opening.messages)  # fmt: skip
    assert all(isinstance(tool, ToolSpec) for tool in opening.tools)


def test_hostile_actions_never_raise(built):
    _, spec, _ = built
    for action in HOSTILE:
        env = spec.factory()
        env.reset(spec.eval[0])
        observation, done, info = env.step(action)
        assert observation is None or isinstance(observation, str)
        assert isinstance(done, bool) and isinstance(info, dict)


def test_the_oracle_scores_above_a_wrong_answer(built):
    recipe, spec, tokenizer = built
    tasks = spec.eval[:3]
    reward = build_reward(recipe, spec)
    config = RolloutConfig(group_size=1, batch_size=3, sampling=SamplingConfig(max_new_tokens_per_turn=1 << 12,
                                                                               max_total_tokens=1 << 15))  # fmt: skip

    def scores(scripts):
        trajectories, _ = RolloutEngine(ScriptedBackend(tokenizer, scripts), spec.factory, config).run(tasks)
        score_trajectories(trajectories, {t.id: t for t in tasks}, reward)
        assert all(t.stop_reason != "env_error" for t in trajectories)
        return [t.reward for t in trajectories]

    oracle = scores({t.id: t.oracle_actions for t in tasks})
    wrong = scores({t.id: ["I do not know."] * 8 for t in tasks})
    assert all(r is not None and math.isfinite(r) for r in oracle)
    assert all(o > (w if w is not None else -math.inf) for o, w in zip(oracle, wrong))
