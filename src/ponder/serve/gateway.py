"""The training gateway: an unchanged agent program's episodes as the trainer's rollouts.

`GatewayRollouts` is a `Rollouts` (ponder.train.rl) for `env.kind: gateway`
(ponder.envs.gateway). It serves the trainer's own generation backend — the live
policy — behind ponder serve's HTTP layer with sessions (serve/session_routes.py) on
127.0.0.1, and for each episode opens a session, runs the program against the
session's `base_url` (an `agent` function, or a `command` in a process of its own),
then turns the session's recorded calls into token-exact trajectories
(rollout/segments.py) carrying the program's reward.

Calls are sampled with the recipe's rollout.sampling (temperature, top_p, the token
budget per call and per episode), whatever the program's requests say: the trainer's
ratios are against the distribution it configured. Each call records the weights
version (the training step) that served it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from ponder.config import RolloutConfig, SamplingConfig
from ponder.envs.gateway import PROGRAM_REWARD, GatewayOptions, ProgramDriven
from ponder.plugins import import_object
from ponder.rollout.engine import RolloutStats, finalise
from ponder.rollout.kv import KVStore
from ponder.serve.batcher import Batcher
from ponder.serve.engine import ModelServer, ServeConfig
from ponder.serve.session_routes import POLICY_NAME, create_gateway_app
from ponder.serve.sessions import Session, Sessions, SessionSampling
from ponder.types import Task, Trajectory, Turn


# How long a batch waits for more calls to join it before it starts. Wider than ponder
# serve's 5 ms: the calls of many programs arrive over HTTP spread out (measured before
# batching was continuous, bench/gateway_overhead.py: at 32 concurrent episodes 0.67x of
# the native engine with 5 ms, 0.90x with 50 ms).
BATCH_WINDOW_S = 0.05
# Sessions whose last call's keys and values are kept for their next call (~25 MB each at
# 600 tokens of the embedded model).
SESSION_KV_ENTRIES = 32


class LiveBackend:
    """The trainer's generation backend as serve's batcher drives it: one model and no
    adapters; the batcher sets `sampling` per batch and installs its `on_token` hook."""

    def __init__(self, backend: Any) -> None:
        self.inner = backend
        self.adapter: str | None = None
        if getattr(backend, "store", None) is not None:  # a session's next call reuses its last one's keys and
            backend.store = KVStore(capacity=SESSION_KV_ENTRIES)  # values, kept while other sessions' calls run
        if not hasattr(backend, "sampling"):  # a scripted teacher samples nothing: the batcher still sets it
            backend.sampling = SamplingConfig(temperature=0.0)

    tokenizer = property(lambda self: self.inner.tokenizer)
    sampling = property(lambda self: self.inner.sampling, lambda self, value: setattr(self.inner, "sampling", value))
    on_token = property(lambda self: getattr(self.inner, "on_token", None),
                        lambda self, value: setattr(self.inner, "on_token", value))  # fmt: skip

    def resolve(self, name: str | None) -> str | None:
        return None

    def generate(self, requests: list[Any], stop_strings: list[str]) -> list[Any]:
        return self.inner.generate(requests, stop_strings)

    def continuous(self) -> bool:
        """Whether the batcher can batch continuously (the hf backend's eager loop)."""
        return hasattr(self.inner, "continuous") and self.inner.continuous()

    def generate_continuous(self, *args: Any) -> int:
        return self.inner.generate_continuous(*args)


class GatewayServer:
    """Sessions over `backend`, served by uvicorn in a thread on host:port (0: any free
    port; `url` says which). `close()` stops the server and its batching worker."""

    def __init__(self, backend: Any, sessions: Sessions, max_staleness: int | None = None,
                 host: str = "127.0.0.1", port: int = 0, max_batch: int = 32) -> None:  # fmt: skip
        self.sessions = sessions
        self.batcher = Batcher(LiveBackend(backend), BATCH_WINDOW_S, max_batch)
        self.batcher.start()
        tokenizer = backend.tokenizer
        model_config = backend.policy.model.config if hasattr(backend, "policy") else None  # none: a teacher
        limit = int(getattr(model_config, "max_position_embeddings", 0) or 1 << 30)
        config = ServeConfig(model=POLICY_NAME, host=host, port=port, max_tokens_limit=limit,
                             max_body_bytes=8_000_000, max_batch_size=max_batch)  # fmt: skip
        self.model_server = ModelServer(config, self.batcher, tokenizer, limit, "hf")
        self.model_server.eos_ids = set(getattr(backend, "eos_ids", {tokenizer.eos_token_id}))
        self.model_server.vocab_size = getattr(model_config, "vocab_size", len(tokenizer))
        app = create_gateway_app(self.model_server, sessions, max_staleness)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="ponder-gateway", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {host}:{port}")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.batcher.stop()


@dataclass
class Outcome:
    """One episode's end: the reward it reported (and its parts), or why it failed."""

    reward: float | None = None
    breakdown: dict[str, float] | None = None
    failure: str | None = None


def reported(value: Any) -> Outcome:
    """A program's return value (or printed last line, parsed) as its reward: a number,
    a dict of named numbers (summed), or None (nothing reported)."""
    if value is None:
        return Outcome()
    parts = value if isinstance(value, dict) else {"reward": value}
    for name, part in parts.items():
        if isinstance(part, bool) or not isinstance(part, (int, float)):
            return Outcome(failure=f"the program reported {name} = {part!r}, not a number")
        if not math.isfinite(part):
            return Outcome(failure=f"the program reported a {part} reward")
    total = float(sum(parts.values()))
    return Outcome(total, {k: float(v) for k, v in parts.items()} if isinstance(value, dict) else None)


class ProgramRunner:
    """Runs the recipe's program for one episode against a session (see GatewayOptions)."""

    def __init__(self, options: GatewayOptions, timeout_s: float) -> None:
        self.options = options
        self.timeout_s = timeout_s
        self.agent = import_object(options.agent, "env.options.agent") if options.agent else None

    async def run(self, task: Task, base_url: str, session: Session, control_url: str) -> Outcome:
        try:
            if self.agent is not None:
                return await asyncio.wait_for(self._call(task, base_url, session.key), self.timeout_s)
            return await self._command(task, base_url, session, control_url)
        except TimeoutError:
            return Outcome(failure=f"the program ran past train.agent_timeout_s ({self.timeout_s:g} s)")
        except Exception as err:  # noqa: BLE001 - a broken program fails its episode, never the run
            return Outcome(failure=f"the program raised {type(err).__name__}: {str(err).splitlines()[0][:300]}"
                           if str(err) else f"the program raised {type(err).__name__}")  # fmt: skip

    async def _call(self, task: Task, base_url: str, key: str) -> Outcome:
        if inspect.iscoroutinefunction(self.agent):
            return reported(await self.agent(task.to_dict(), base_url, key))
        return reported(await asyncio.to_thread(self.agent, task.to_dict(), base_url, key))

    async def _command(self, task: Task, base_url: str, session: Session, control_url: str) -> Outcome:
        env = {**os.environ, **self.options.env, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": session.key,
               "PONDER_TASK": json.dumps(task.to_dict()), "PONDER_MODEL": self.options.model,
               "PONDER_REWARD_URL": f"{control_url}/v1/sessions/{session.id}/reward"}  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *self.options.command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout ends everything it started
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.timeout_s)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            raise
        if process.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or [""])[-1][:300]
            return Outcome(failure=f"the program exited with status {process.returncode}: {last}")
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            value = json.loads(lines[-1]) if lines else None
        except ValueError:
            value = None  # not a reward line: the reward endpoint (or the recipe) scores it
        return reported(value if isinstance(value, (int, float, dict)) and not isinstance(value, bool) else None)


class GatewayRollouts:
    """The rollout engine of a program-driven recipe (see module docstring), built by
    ponder.rollout.engine.build_engine from a `ProgramDriven` factory: `run(tasks)` runs
    every task rollout.group_size times, at most env.options.concurrency (else
    rollout.batch_size) episodes at once, on a gateway started by the first run."""

    constraint = None  # rollout.constrain is the program's business (its tool_choice, response_format)

    def __init__(self, backend: Any, factory: ProgramDriven, config: RolloutConfig) -> None:
        self.backend, self.config, self.options = backend, config, factory.options
        sampling = config.sampling
        limits = SessionSampling(sampling.temperature, sampling.top_p, sampling.max_new_tokens_per_turn,
                                 sampling.max_total_tokens)  # fmt: skip
        self.sessions = Sessions(secrets.token_urlsafe(24), limits)
        self.max_staleness = factory.max_staleness
        self.runner = ProgramRunner(factory.options, factory.timeout_s)
        self.concurrency = max(1, factory.options.concurrency or config.batch_size)
        self.server: GatewayServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last: dict[str, float] = {}

    def begin_step(self, step: int) -> None:
        self.sessions.version = step  # calls from now on are served by this step's weights

    def run(self, tasks: list[Task], on_episode_done: Callable[[Trajectory], None] | None = None
            ) -> tuple[list[Trajectory], RolloutStats]:  # fmt: skip
        """Trajectories in task order (a session that rewrote its history gives several;
        one that made no call, none)."""
        if self.options.agent is None and self.options.command is None:
            raise ValueError("env.options for gateway gives no `agent` or `command` to run: ponder train and "
                             "ponder eval need one; `ponder gateway` serves sessions to outside drivers")  # fmt: skip
        start = time.perf_counter()
        if self.server is None:  # started on first use, kept until close() (its threads are daemons)
            self.server = GatewayServer(self.backend, self.sessions, self.max_staleness, max_batch=self.concurrency)
            # one loop for every run: clients a program leaves behind close on the loop they were made on
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="ponder-gateway-programs", daemon=True).start()
        episodes = asyncio.run_coroutine_threadsafe(
            self._episodes(self.server, [t for t in tasks for _ in range(self.config.group_size)], on_episode_done),
            self._loop,
        ).result()
        trajectories = [t for session_trajectories in episodes for t in session_trajectories]
        wall = time.perf_counter() - start
        counted = lambda name: sum(t.metrics.get(name, 0.0) for t in trajectories)  # noqa: E731
        self._last = {"gateway/episodes": float(len(episodes)), "gateway/failed": counted("gateway/failed"),
                      "gateway/segments": float(sum(bool(t.response_ids) for t in trajectories)),
                      "gateway/drift": counted("gateway/drift"), "gateway/rewrites": counted("gateway/rewrites"),
                      "gateway/episodes_per_s": len(episodes) / wall if wall > 0 else 0.0}  # fmt: skip
        kept = [t for t in trajectories if t.response_ids]
        return kept, RolloutStats(len(episodes), sum(sum(t.loss_mask) for t in kept), wall, 0.0, wall)

    def step_metrics(self) -> dict[str, float]:
        """The last run's counts: episodes, failed, segments, drift, rewrites, episodes/s."""
        return dict(self._last)

    def close(self) -> None:
        """Stop the gateway's server (a later run starts another)."""
        if self.server is not None:
            self.server.close()
            self.server = None
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _episodes(self, server: GatewayServer, tasks: list[Task],
                        on_episode_done: Callable[[Trajectory], None] | None) -> list[list[Trajectory]]:  # fmt: skip
        gate = asyncio.Semaphore(self.concurrency)

        async def one(task: Task) -> list[Trajectory]:
            async with gate:
                session = self.sessions.open(task.id)
                base_url = f"{server.url}/sessions/{session.id}/v1"
                outcome = await self.runner.run(task, base_url, session, server.url)
                done = episode_trajectories(self.sessions.collect(session.id), outcome, self.backend.tokenizer)
                if on_episode_done is not None:
                    on_episode_done(done[0])
                return done

        return await asyncio.gather(*[one(task) for task in tasks])


def episode_trajectories(session: Session, outcome: Outcome, tokenizer: Any) -> list[Trajectory]:
    """A finished session as trajectories: the program's reward (returned, else posted)
    on each, its failure (reward 0) on the last turn, the session's counts on the first."""
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    trajectories = session.trajectories(decode) or [Trajectory(task_id=session.task_id, prompt_ids=[],
                                                               group_id=session.task_id)]  # fmt: skip
    reward = outcome.reward if outcome.reward is not None else session.reward
    if outcome.failure is not None:
        reward = 0.0
        last = trajectories[-1]
        if not last.turns:
            last.turns.append(Turn(0, ""))
        last.turns[-1].error = outcome.failure
        last.stop_reason = "program_error"
    else:
        trajectories[-1].stop_reason = "done"  # the program ended the episode itself
    for trajectory in trajectories:
        finalise(trajectory)
        if reward is not None:
            trajectory.metrics[PROGRAM_REWARD] = float(reward)
        trajectory.metrics["gateway/failed"] = 0.0
    first = trajectories[0]
    first.metrics.update({"gateway/failed": float(outcome.failure is not None), "gateway/drift": float(session.drift),
                          "gateway/rewrites": float(session.rewrites), "gateway/calls": float(len(session.calls))})
    return trajectories


class OnlineRollouts:
    """`ponder gateway` (online mode): the sessions come from outside drivers — another
    process, another language — that open them with the admin key, run their agent
    against the session's base_url, post a reward and end them. Each training step
    waits for `need` ended sessions (train.tasks_per_step x rollout.group_size) and
    trains on them; sessions that share a `task_id` form one GRPO group.
    `tasks_served` tells the trainer which tasks those were (the drivers', not its own)."""

    def __init__(self, backend: Any, sampling: Any, need: int, host: str, port: int, admin_key: str,
                 max_staleness: int | None = None, poll_s: float = 0.2) -> None:  # fmt: skip
        limits = SessionSampling(sampling.temperature, sampling.top_p, sampling.max_new_tokens_per_turn,
                                 sampling.max_total_tokens)  # fmt: skip
        self.sessions = Sessions(admin_key, limits)
        self.server = GatewayServer(backend, self.sessions, max_staleness, host, port)
        self.backend, self.need, self.poll_s = backend, need, poll_s
        self._served: list[Task] = []
        self._last: dict[str, float] = {}

    def begin_step(self, step: int) -> None:
        self.sessions.version = step

    def run(self, tasks: list[Task]) -> tuple[list[Trajectory], RolloutStats]:
        """The next `need` ended sessions, oldest first (the sampler's `tasks` are not used)."""
        start = time.perf_counter()
        while len(ended := self.sessions.ended()) < self.need:
            time.sleep(self.poll_s)
        collected = [self.sessions.collect(session.id) for session in ended[: self.need]]
        trajectories = [t for s in collected for t in episode_trajectories(s, Outcome(), self.backend.tokenizer)]
        kept = [t for t in trajectories if t.response_ids]
        self._served = [Task(task_id, "", []) for task_id in dict.fromkeys(t.task_id for t in kept)]
        wall = time.perf_counter() - start
        self._last = {"gateway/episodes": float(len(collected)), "gateway/segments": float(len(kept)),
                      "gateway/drift": float(sum(s.drift for s in collected)),
                      "gateway/rewrites": float(sum(s.rewrites for s in collected)),
                      "gateway/unrewarded": float(sum(s.reward is None for s in collected))}  # fmt: skip
        return kept, RolloutStats(len(collected), sum(sum(t.loss_mask) for t in kept), wall, 0.0, wall)

    def tasks_served(self, asked: list[Task]) -> list[Task]:
        return list(self._served)

    def submit(self, tasks: list[Task]) -> Any:
        raise ValueError("ponder gateway trains on sessions as they end: leave train.async_rollouts off")

    def result(self, pending: Any) -> tuple[list[Trajectory], RolloutStats]:
        raise ValueError("ponder gateway runs no rollouts in the background")

    def step_metrics(self) -> dict[str, float]:
        return dict(self._last)

    def close(self) -> None:
        self.server.close()
