"""Search-QA takes its settings from its own options (env.options) and brings its own
reward components and default weights: nothing of it is left in the core sections."""

from __future__ import annotations

import pytest

from ponder.config import ConfigError, load_recipe
from ponder.envs.search_qa import REWARD_COMPONENTS, REWARD_WEIGHTS, SearchQAEnvFactory, SearchQAOptions
from ponder.rewards import REWARDS
from ponder.wiring import build_env, build_reward

SMALL = ["env.options.taskgen.n_people=20", "env.options.taskgen.n_train=6", "env.options.taskgen.n_eval=3"]


def test_the_spec_brings_search_qa_s_components_at_their_default_weights():
    spec = build_env(load_recipe(None, SMALL))
    assert spec.reward_weights == REWARD_WEIGHTS == {"em": 1.0, "f1": 0.0, "format": 0.1, "search_cost": -0.05}
    assert spec.rewards == REWARD_COMPONENTS
    assert all(spec.rewards[name] is REWARDS.get(name) for name in REWARD_WEIGHTS)  # the registered ones
    assert build_reward(load_recipe(None, SMALL), spec).weights == REWARD_WEIGHTS


def test_options_reach_the_episodes_and_the_world():
    recipe = load_recipe(None, [*SMALL, "env.options.retriever.topk=1", "env.options.max_obs_tokens=32",
                                "env.options.max_invalid_actions=2", "env.max_turns=2",
                                "reward.terms.search_cost=-0.2"])  # fmt: skip
    spec = build_env(recipe)
    factory = spec.factory
    assert isinstance(factory, SearchQAEnvFactory)
    assert (factory.topk, factory.max_obs_tokens, factory.max_invalid_actions, factory.max_turns) == (1, 32, 2, 2)
    assert factory.search_cost == -0.2  # each search's per-turn reward is its weight
    assert (len(spec.train), len(spec.eval)) == (6, 3)
    assert SearchQAOptions.from_recipe(recipe).taskgen.n_people == 20


def test_a_bad_option_fails_when_the_env_is_built_naming_the_key():
    with pytest.raises(ConfigError, match=r"env.kind search_qa: unknown key 'env\.options\.max_turns'"):
        build_env(load_recipe(None, ["env.options.max_turns=3"]))  # max_turns is env.max_turns
    with pytest.raises(ConfigError, match=r"'env\.options\.retriever' topk must be >= 1, got 0"):
        build_env(load_recipe(None, ["env.options.retriever.topk=0"]))


def test_ponder_envs_exports_the_protocol_and_no_environment():
    import ponder.envs as envs
    from ponder.envs import base

    assert {"Env", "EnvSpec", "EnvContext", "Opening", "register_env", "resolve_env", "load_tasks_from"} <= set(envs.__all__)
    assert all(getattr(envs, name) is getattr(base, name) for name in envs.__all__ if hasattr(base, name))
    assert not [name for name in envs.__all__ if "search" in name.lower() or "world" in name.lower()]
