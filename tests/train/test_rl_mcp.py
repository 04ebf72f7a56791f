"""RL on tools that come from an MCP server: the math env's calculator is served by a
real `ponder mcp-serve` subprocess named in the recipe (env.mcp_servers), and one RL
step of the tiny model runs on it. The actions are the tasks' reference solutions (a
scripted sampler: a random tiny model never writes a <calculator> call), so every
episode calls the tool; the server's call log and the observations prove the calls
went over MCP. The update itself is the real one."""

from __future__ import annotations

import json

import pytest
import torch

from ponder.config import load_recipe
from ponder.rollout import ScriptedBackend
from ponder.runlog.metrics_log import read_metrics
from ponder.train.rl import RLTrainer
from ponder.models.prepare import prepare_policy
from ponder.wiring import build_env, build_reward, check_parts, train_tasks


class OracleSampler(ScriptedBackend):
    """Replays each task's oracle actions; has the sampling state the trainer saves."""

    def __init__(self, tokenizer, scripts):
        super().__init__(tokenizer, scripts)
        self.generator = torch.Generator().manual_seed(0)

    def refresh(self) -> None:  # no weights of its own to rebuild
        pass


def _recipe(log, extra=()):
    server = f"[{{name: calc, command: [python, -m, ponder.cli, mcp-serve, --tools, calculator, --call-log, {log}]}}]"
    return load_recipe(None, [
        "model.name=tiny", "env.kind=math", "env.options={n_train: 4, n_eval: 2, seed: 3, difficulties: [2], "
        "calculator_from: 1}", "env.max_turns=2", f"env.mcp_servers={server}", "train.steps=1",
        "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4", "lora.r=4",
        "algo.micro_batch_size=2", "rollout.sampling.max_new_tokens_per_turn=256",
        "rollout.sampling.max_total_tokens=1024", *extra,
    ])  # fmt: skip


def test_one_rl_step_on_a_calculator_served_over_mcp(tmp_path):
    log = tmp_path / "calls.jsonl"
    recipe = _recipe(log)
    policy = prepare_policy(recipe)
    spec = build_env(recipe, policy.tokenizer)
    tasks = train_tasks(recipe, spec)
    expressions = {t.id: t.oracle_actions[0].split("<calculator>")[1].split("</calculator>")[0] for t in tasks}
    seen: list[str] = []

    def factory():  # the recipe's env, watched: what each calculator call showed the policy
        env = spec.factory()
        step = env.step

        def watched(action):
            observation, done, info = step(action)
            seen.extend(result.content for result in info["turn"].tool_results)
            return observation, done, info

        env.step = watched
        return env

    # sample 0 of each group gives the reference solution, sample 1 the same call and a wrong
    # answer: the group's rewards differ, so the update has a non-zero advantage to follow
    scripts = {f"{t.id}#0": t.oracle_actions for t in tasks}
    scripts.update({f"{t.id}#1": [t.oracle_actions[0], "<answer>-1</answer>"] for t in tasks})
    backend = OracleSampler(policy.tokenizer, scripts)
    trainer = RLTrainer(policy, factory, tasks, build_reward(recipe, spec), backend, recipe, tmp_path / "run")
    trainer.train()

    (record,) = read_metrics(tmp_path / "run")
    assert record["step"] == 1 and record["reward/correct"] == 0.5  # half the answers are right
    assert record["reward/calc_cost"] == 1.0 and record["episode/parse_errors"] == 0.0  # one call per episode
    assert record["optim/grad_norm"] > 0.0
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 4 and not any(call["is_error"] for call in calls)  # 2 tasks x 2 samples, over MCP
    drawn = {call["arguments"]["expression"] for call in calls}
    assert drawn <= set(expressions.values()) and len(drawn) == 2
    from ponder.tools.builtin import evaluate_expression

    assert sorted(seen) == sorted(str(evaluate_expression(call["arguments"]["expression"])) for call in calls)
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()


def test_a_recipe_whose_server_cannot_start_fails_in_one_line_naming_it(tmp_path):
    recipe = load_recipe(None, ["env.kind=math", "env.mcp_servers=[{name: broken, command: [/nonexistent/mcp]}]"])
    with pytest.raises(ValueError, match=r"^MCP server 'broken' \(/nonexistent/mcp\): could not connect"):
        check_parts(recipe)
    unknown = load_recipe(None, ["env.kind=math", "env.mcp_servers=[{name: calc, command: [x], tool: y}]"])
    with pytest.raises(ValueError, match=r"env.mcp_servers\[0\] \(calc\): unknown key 'tool'"):
        check_parts(unknown)


def test_a_served_tool_the_env_does_not_use_is_refused(tmp_path):
    server = "[{name: calc, command: [python, -m, ponder.cli, mcp-serve, --tools, 'calculator,echo']}]"
    recipe = load_recipe(None, ["env.kind=math", f"env.mcp_servers={server}"])
    with pytest.raises(ValueError, match="env 'math' does not use the served tool 'echo'"):
        check_parts(recipe)


def test_the_shipped_math_mcp_recipe_gets_its_calculator_over_mcp():
    recipe = load_recipe("recipes/math_mcp.yaml")
    spec = build_env(recipe)
    env = spec.factory()
    assert env.registry.get("calculator").fn.__name__ == "call_remote"  # not the built-in one
    task = spec.train[0]
    env.reset(task)
    observation, done, _ = env.step(task.oracle_actions[0])
    assert not done and observation.strip().startswith("<result>") and "</result>" in observation
