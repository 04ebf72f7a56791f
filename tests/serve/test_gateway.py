"""The training gateway on 127.0.0.1 with the tiny model: sessions through the real
`openai` client, token-exact recording, the control routes' keys, and the faults a
program can commit (serve/sessions.py, serve/session_routes.py, serve/gateway.py)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from typing import Literal

import httpx
import openai
import pytest
import torch
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from ponder.config import RolloutConfig, SamplingConfig
from ponder.envs.gateway import PROGRAM_REWARD, GatewayOptions, ProgramDriven
from ponder.models.loading import load_policy
from ponder.models.logprobs import token_logprobs
from ponder.rollout.engine import build_engine
from ponder.rollout.hf import HFBackend
from ponder.serve.gateway import GatewayRollouts, GatewayServer, reported
from ponder.serve.sessions import Sessions, SessionSampling
from ponder.types import Task

ADMIN = "admin-key"
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic",
                                           "parameters": {"type": "object", "properties": {"expression": {
                                               "type": "string"}}, "required": ["expression"]}}}]  # fmt: skip


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", device="cpu")


@pytest.fixture(scope="module")
def gateway(policy):
    backend = HFBackend(policy, SamplingConfig(temperature=1.0, max_new_tokens_per_turn=12), seed=0)
    sessions = Sessions(ADMIN, SessionSampling(temperature=1.0, max_tokens=12, max_context=4000))
    server = GatewayServer(backend, sessions, max_staleness=1)
    yield server
    server.close()


def open_session(gateway, key: str = ADMIN, task_id: str = "t1") -> dict:
    reply = httpx.post(f"{gateway.url}/v1/sessions", json={"task_id": task_id},
                       headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_two_call_session_is_one_token_exact_trajectory(gateway, policy) -> None:
    opened = open_session(gateway)
    assert opened["base_url"] == f"{gateway.url}/sessions/{opened['id']}/v1"
    client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, temperature=0.0)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "Are you sure?"})
    reused = gateway.batcher.backend.inner.reused_tokens
    client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=500)
    session = gateway.sessions.get(opened["id"])
    one, two = session.calls
    # the second call read only what the first had not: its keys and values were kept
    assert gateway.batcher.backend.inner.reused_tokens - reused == len(one.prompt_ids) + len(one.completion_ids) - 1
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.completion_ids)] == one.prompt_ids + one.completion_ids
    assert len(two.completion_ids) <= 12  # the session's cap, not the request's 500
    (trajectory,) = session.trajectories()
    assert trajectory.loss_mask.count(1) == len(one.completion_ids) + len(two.completion_ids)
    between = len(two.prompt_ids) - len(one.prompt_ids) - len(one.completion_ids)
    assert trajectory.loss_mask == [1] * len(one.completion_ids) + [0] * between + [1] * len(two.completion_ids)
    # the recorded logprobs are the trainer's at the same weights (temperature 1, fp32)
    ids = torch.tensor([trajectory.prompt_ids + trajectory.response_ids])
    recomputed = token_logprobs(policy.model, ids, torch.ones_like(ids))[0, len(trajectory.prompt_ids) - 1 :]
    policy_rows = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
    recorded = torch.tensor(trajectory.old_logprobs)[policy_rows]
    assert (recomputed[policy_rows] - recorded).abs().mean().item() < 1e-4
    shown = httpx.get(f"{gateway.url}/v1/sessions/{opened['id']}", headers={"Authorization": f"Bearer {ADMIN}"})
    assert shown.json()["segments"] == 1 and len(shown.json()["calls"]) == 2


def test_streamed_calls_are_recorded_too(gateway) -> None:
    opened = open_session(gateway)
    client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Hi"}], stream=True) if chunk.choices)  # fmt: skip
    (call,) = gateway.sessions.get(opened["id"]).calls
    assert call.completion_ids and text.strip() in call.text


def test_control_routes_and_keys_are_refused_with_one_line_reasons(gateway) -> None:
    assert httpx.post(f"{gateway.url}/v1/sessions", headers={"Authorization": "Bearer wrong"}).status_code == 401
    mine, theirs = open_session(gateway), open_session(gateway)
    stranger = openai.OpenAI(base_url=mine["base_url"], api_key=theirs["api_key"], max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="does not open session"):
        stranger.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    own = openai.OpenAI(base_url=mine["base_url"], api_key=mine["api_key"], max_retries=0)
    with pytest.raises(openai.NotFoundError, match="a session serves 'policy'"):
        own.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "x"}])
    headers = {"Authorization": f"Bearer {mine['api_key']}"}
    nan = httpx.post(f"{gateway.url}/v1/sessions/{mine['id']}/reward", content='{"reward": NaN}', headers=headers)
    assert nan.status_code == 400 and "finite number" in nan.json()["error"]["message"]
    big = httpx.post(f"{mine['base_url']}/chat/completions", headers=headers,
                     json={"model": "policy", "messages": [{"role": "user", "content": "x" * 10_000_000}]})  # fmt: skip
    assert big.status_code == 413
    ok = httpx.post(f"{gateway.url}/v1/sessions/{mine['id']}/reward", json={"reward": 0.25}, headers=headers)
    assert ok.status_code == 200 and gateway.sessions.get(mine["id"]).reward == 0.25
    assert gateway.sessions.get(mine["id"]).calls == []  # nothing refused was recorded


def test_a_stale_session_gets_429_with_retry_after(gateway) -> None:
    opened = open_session(gateway)
    gateway.sessions.version += 2  # two updates since it opened; the bound is 1
    try:
        reply = httpx.post(f"{opened['base_url']}/chat/completions", headers={"Authorization": f"Bearer {opened['api_key']}"},
                           json={"model": "policy", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    finally:
        gateway.sessions.version -= 2
    assert reply.status_code == 429 and reply.headers["retry-after"] == "1"
    assert "weight versions ago" in reply.json()["error"]["message"]


def test_reported_rewards() -> None:
    assert reported(1).reward == 1.0 and reported(None).reward is None
    both = reported({"correct": 1.0, "format": 0.1})
    assert both.reward == pytest.approx(1.1) and both.breakdown == {"correct": 1.0, "format": 0.1}
    assert "nan reward" in reported(float("nan")).failure and "not a number" in reported("high").failure


# --- programs as episodes --------------------------------------------------------------

async def answering(task, base_url, api_key):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    return {"correct": float(task["id"] == "a")}


async def raising(task, base_url, api_key):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    raise RuntimeError("the tool broke")


async def hanging(task, base_url, api_key):
    await asyncio.sleep(60)


async def silent(task, base_url, api_key):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])


def rollouts(policy, options: GatewayOptions, timeout_s: float = 30.0, tokens: int = 8):
    """The engine build_engine gives for a program-driven factory."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens_per_turn=tokens, max_total_tokens=4000)
    backend = HFBackend(policy, sampling, seed=0)
    config = RolloutConfig(batch_size=4, group_size=2, sampling=backend.sampling)
    engine = build_engine(backend, ProgramDriven(options, timeout_s), config)
    assert isinstance(engine, GatewayRollouts)
    return engine


TASKS = [Task("a", "What is 1+1?", ["2"]), Task("b", "What is 2+2?", ["4"])]


def test_program_episodes_become_groups_with_the_programs_reward(policy) -> None:
    gateway = rollouts(policy, GatewayOptions(agent=f"{__name__}:answering", tasks="unused.jsonl"))
    trajectories, stats = gateway.run(TASKS)
    assert [t.task_id for t in trajectories] == ["a", "a", "b", "b"] and stats.episodes == 4
    assert [t.metrics[PROGRAM_REWARD] for t in trajectories] == [1.0, 1.0, 0.0, 0.0]
    assert all(sum(t.loss_mask) == len(t.response_ids) > 0 for t in trajectories)
    assert gateway.step_metrics()["gateway/failed"] == 0.0


@pytest.mark.parametrize("program, reason", [
    ("raising", "the program raised RuntimeError: the tool broke"),
    ("hanging", "ran past train.agent_timeout_s (1 s)"),
])  # fmt: skip
def test_a_failing_program_fails_its_episode_and_the_run_goes_on(policy, program, reason) -> None:
    gateway = rollouts(policy, GatewayOptions(agent=f"{__name__}:{program}", tasks="unused.jsonl"), timeout_s=1)
    trajectories, _ = gateway.run(TASKS[:1])
    metrics = gateway.step_metrics()
    assert metrics["gateway/failed"] == 2.0
    if program == "raising":  # it called the model first: trained on, with reward 0 and the reason
        assert [t.metrics[PROGRAM_REWARD] for t in trajectories] == [0.0, 0.0]
        assert all(t.turns[-1].error == reason and t.stop_reason == "program_error" for t in trajectories)
    else:
        assert trajectories == []  # no call was made: nothing to train on


def test_a_program_that_reports_nothing_leaves_the_reward_unset(policy) -> None:
    gateway = rollouts(policy, GatewayOptions(agent=f"{__name__}:silent", tasks="unused.jsonl"))
    trajectories, _ = gateway.run(TASKS[:1])
    assert len(trajectories) == 2 and all(PROGRAM_REWARD not in t.metrics for t in trajectories)


COMMAND = """
import json, os, sys, openai
task = json.loads(os.environ["PONDER_TASK"])
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the gateway
client.chat.completions.create(model=os.environ["PONDER_MODEL"], messages=[{"role": "user", "content": task["question"]}])
if task["id"] == "b":
    sys.exit("no answer for b")
print("thinking...")
print(json.dumps({"correct": 1.0}))
"""


def test_a_command_program_runs_per_episode_and_reports_on_its_last_line(policy, tmp_path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(COMMAND)
    gateway = rollouts(policy, GatewayOptions(command=[sys.executable, str(script)], tasks="unused.jsonl"))
    trajectories, _ = gateway.run(TASKS)
    metrics = gateway.step_metrics()
    by_task = {t.task_id: t for t in trajectories}
    assert by_task["a"].metrics[PROGRAM_REWARD] == 1.0
    assert by_task["b"].metrics[PROGRAM_REWARD] == 0.0
    assert by_task["b"].turns[-1].error == "the program exited with status 1: no answer for b"
    assert metrics["gateway/failed"] == 2.0 and json.loads(json.dumps(metrics))


async def example_with_noise(task, base_url, api_key):
    """The shipped example, plus a random term: the tiny model never answers right, and a
    step needs rewards that differ within a group to move the weights."""
    from examples.agents.openai_loop import run

    return {**await run(task, base_url, api_key), "noise": random.random()}


@pytest.mark.parametrize("agent", ["examples.agents.openai_loop:run", "examples.agents.langchain_agent:run",
                                   "command", f"{__name__}:example_with_noise"])  # fmt: skip
def test_one_rl_step_from_the_example_program(tmp_path, agent) -> None:
    """The shipped OpenAI-SDK example trains through the gateway: one GRPO step on the tiny model."""
    from ponder.config import load_recipe
    from ponder.jobs.parts import rl_trainer

    recipe = load_recipe("recipes/gateway_math.yaml", [
        "model.name=tiny", "train.steps=1", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "env.options.tasks_from.options.n_train=8",
        "env.options.tasks_from.options.n_eval=4", "lora.r=2", "lora.alpha=4", "sft.steps=0",
        *([f"env.options.agent={agent}"] if agent != "command" else
          ["env.options.agent=null", f"env.options.command=[{sys.executable}, examples/agents/openai_command.py]"])])
    trainer = rl_trainer(recipe, tmp_path)
    assert isinstance(trainer.engine, GatewayRollouts)
    before = [p.detach().clone() for p in trainer.policy.model.parameters() if p.requires_grad]
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["gateway/episodes"] == 4.0 and metrics["gateway/failed"] == 0.0
    after = [p.detach() for p in trainer.policy.model.parameters() if p.requires_grad]
    moved = any(not torch.equal(a, b) for a, b in zip(before, after))
    if agent.endswith("example_with_noise"):
        assert moved and abs(metrics["policy/ratio_mean"] - 1.0) < 1e-4  # recorded logprobs = the trainer's
    else:
        assert metrics["reward/mean"] == 0.0 and not moved  # tied groups: no signal, no step


@tool
def weather(city: Literal["Paris", "Oslo"]) -> str:
    """Today's weather in a city."""
    return f"sunny in {city}"


async def langchain_forced(task, base_url, api_key):
    """A LangChain agent whose every turn is a strict, forced call (constrained decoding
    makes even the tiny model write valid ones, bounded by the enum), three turns."""
    model = ChatOpenAI(model="policy", base_url=base_url, api_key=api_key, max_retries=0)
    agent = model.bind_tools([weather], tool_choice="weather", strict=True, parallel_tool_calls=False)
    messages = [HumanMessage(task["question"])]
    for _ in range(3):
        reply = await agent.ainvoke(messages)
        messages.append(reply)
        messages += [ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]) for call in reply.tool_calls]
    return 1.0


def test_a_langchain_agents_tool_turns_are_one_trajectory(policy) -> None:
    gateway = rollouts(policy, GatewayOptions(agent=f"{__name__}:langchain_forced", tasks="unused.jsonl"), tokens=200)
    trajectories, _ = gateway.run(TASKS[:1])
    metrics = gateway.step_metrics()
    assert metrics["gateway/failed"] == 0.0 and metrics["gateway/rewrites"] == 0.0
    assert metrics["gateway/segments"] == 2.0  # one per episode: the reply was read back, not re-encoded
    for trajectory in trajectories:
        assert len(trajectory.turns) == 3 and "sunny in" in trajectory.turns[0].observation  # the tool's answer
        assert 0 in trajectory.loss_mask and trajectory.loss_mask[0] == 1


def test_the_warm_up_records_the_program_against_the_reference_solver(policy) -> None:
    """sft demonstrations of a gateway recipe: the example program run against its
    teacher (a scripted solver served as the model), each episode one trajectory."""
    from ponder.config import load_recipe
    from ponder.jobs.parts import recipe_demonstrations

    recipe = load_recipe("recipes/gateway_math.yaml", ["model.name=tiny", "sft.examples=3",
                                                       "env.options.tasks_from.options.n_train=8"])  # fmt: skip
    demonstrations = recipe_demonstrations(recipe, policy)
    assert len(demonstrations) == 3
    for trajectory in demonstrations:
        call, answer = (turn.action for turn in trajectory.turns)
        assert call.startswith('<tool_call>\n{"name": "calculator"') and answer.startswith("Answer: ")
        result = trajectory.turns[0].observation  # the program's own calculator, as the tool turn
        assert answer.removeprefix("Answer: ") in result and trajectory.stop_reason == "done"
        sampled = [i for i, m in enumerate(trajectory.loss_mask) if m]
        assert trajectory.loss_mask[0] == 1 and 0 in trajectory.loss_mask and len(sampled) < len(trajectory.loss_mask)


def test_recorded_turns_carry_the_calls_the_program_was_sent(policy) -> None:
    gateway = rollouts(policy, GatewayOptions(agent=f"{__name__}:langchain_forced", tasks="unused.jsonl"), tokens=200)
    trajectories, _ = gateway.run(TASKS[:1])
    for trajectory in trajectories:
        assert all(turn.tool_calls and turn.tool_calls[0].name == "weather" for turn in trajectory.turns)
        assert trajectory.metrics["tool_calls"] == 3.0 and trajectory.metrics["tool_calls/weather"] == 3.0


def test_async_rollouts_through_the_gateway_train_one_step_behind(tmp_path) -> None:
    """train.async_rollouts: the next step's sessions are served by the weights before
    the update; their recorded logprobs are the ratio's denominator (off 1 by then)."""
    from ponder.config import load_recipe
    from ponder.jobs.parts import rl_trainer

    recipe = load_recipe("recipes/gateway_math.yaml", [
        "model.name=tiny", "train.steps=2", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=8", "env.options.tasks_from.options.n_train=8",
        "env.options.tasks_from.options.n_eval=4", "lora.r=2", "lora.alpha=4", "sft.steps=0", "optim.lr=1e-2",
        f"env.options.agent={__name__}:example_with_noise", "train.async_rollouts=true"])  # fmt: skip
    steps = []
    rl_trainer(recipe, tmp_path).train(on_step=lambda step, metrics: steps.append(metrics))
    assert [m["policy/staleness"] for m in steps] == [0.0, 1.0]
    assert abs(steps[0]["policy/ratio_mean"] - 1.0) < 1e-4 < abs(steps[1]["policy/ratio_mean"] - 1.0)


def test_one_rl_step_from_the_smolagents_example(tmp_path) -> None:
    """smolagents' ToolCallingAgent re-renders its memory each step (calls as text, results
    as user turns), so each call is a segment of its own: trained on all the same."""
    from ponder.config import load_recipe
    from ponder.jobs.parts import rl_trainer

    recipe = load_recipe("recipes/gateway_math.yaml", [
        "model.name=tiny", "train.steps=1", "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=200", "rollout.sampling.max_total_tokens=4000",
        "env.options.tasks_from.options.n_train=8", "env.options.tasks_from.options.n_eval=4", "lora.r=2",
        "lora.alpha=4", "sft.steps=0", "env.options.agent=examples.agents.smolagents_agent:run"])  # fmt: skip
    trainer = rl_trainer(recipe, tmp_path)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    # (the random tiny model's forced calls can run out of tokens before they close: such an
    # episode fails with the server's 422, so only some of the four have segments)
    assert metrics["gateway/episodes"] == 4.0 and metrics["gateway/segments"] >= 2.0
    assert metrics["gateway/rewrites"] >= 1.0  # a rewritten history is split, never re-tokenised


def test_the_smolagents_teacher_ends_with_final_answer() -> None:
    from examples.agents.smolagents_agent import demonstration

    task = {"answers": ["59"], "oracle_actions": ["<calculator>40 + 19</calculator>"]}
    call, final = demonstration(task)
    assert '"expression": "40 + 19"' in call and json.loads(final.split("\n")[1]) == {
        "name": "final_answer", "arguments": {"answer": "59"}}
