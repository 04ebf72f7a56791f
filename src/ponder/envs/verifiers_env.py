"""`env.kind: verifiers`: an installed verifiers environment, trained on its own dataset
with its own rubric as the reward.

verifiers (Prime Intellect's format) packages an environment as a module with
`load_environment(**env_args)` returning a `vf.Environment`: a dataset (`prompt` or
`question`, `answer`, `info`, `task` columns), a rubric of reward functions (sync or
async) and, for multi-turn ones (`MultiTurnEnv`, `ToolEnv`, `StatefulToolEnv` …), an
`env_response` that answers each model turn. The environment owns its rollout loop and
asks a `vf.Client` for each model turn; this adapter runs that loop unchanged, on an
event-loop thread, with a client whose "model" is ponder's engine: the client hands the
prompt to `reset` / `step` and waits for the action the policy generated. So every stop
condition, `setup_state`, `env_response`, cleanup handler and the rubric itself are the
environment's own code.

When the environment's rollout ends, its rubric scores the episode exactly as verifiers
does (`score_group` over the one rollout; rubric functions that need a whole group are
refused when the environment is built), and the score of each rubric function goes to
the trajectory's metrics (`verifiers/<function>`). Each function is a reward component
of the same name at the rubric's weight (`reward.terms` changes it). An episode ponder
ends before the environment does (the token budget) has no rubric score: unscorable.

The classic verifiers API lives in verifiers 0.3.x (`verifiers.legacy`, answering at
`import verifiers as vf`); 0.4 replaced it with `verifiers.v1`. verifiers 0.3.1 pins
`mcp<2` (only its experimental MCPEnv imports mcp), which ponder's own `mcp==2.3.0`
excludes, so it is installed beside ponder[envs] with `--no-deps`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ponder.config.load import from_dict
from ponder.envs.base import BaseEnv, EnvContext, EnvSpec, Opening, register_env
from ponder.envs.chat_turns import continuation
from ponder.extras import MissingExtra
from ponder.tools.parsers import HermesParser
from ponder.types import Task, ToolCall, ToolSpec, Trajectory, Turn

VERSION = "0.3.1"
INSTALL = f"pip install 'ponder[envs]' && pip install --no-deps verifiers=={VERSION}"
METRIC = "verifiers/"  # the trajectory metrics the rubric's scores go to
# verifiers' stop conditions in ponder's stop-reason words (others keep verifiers' name)
STOP_REASONS = {"max_turns_reached": "max_turns", "has_error": "env_error", "prompt_too_long": "max_tokens",
                "no_tools_called": "answer", "timeout_reached": "timeout"}  # fmt: skip
TOOLS_PROMPT = (
    "You may call these functions. To call one, write <tool_call>{{\"name\": \"function_name\", \"arguments\": "
    "{{...}}}}</tool_call>; each result comes back in <tool_response></tool_response>. Answer without a call "
    "when you are done.\n<tools>\n{tools}\n</tools>"
)
logger = logging.getLogger(__name__)


@dataclass
class VerifiersOptions:
    """env.options of `verifiers`.

    env_id: the installed environment (`vf-gsm8k`, or a module path such as
        `examples.envs.verifiers_arith`), loaded with `verifiers.load_environment`.
    env_args: keyword arguments for its `load_environment`.
    n_train / n_eval: tasks per split (0 = every row).
    eval_fraction: the share of the dataset held out for evaluation when the
        environment has no `eval_dataset` (the last rows).
    oracle: a reference completion made from each row's columns (`<answer>{answer}</answer>`),
        the demo's ceiling and the SFT warm-up's demonstrations; empty = none.
    timeout_s: the longest the environment may take to answer one turn.
    """

    env_id: str = ""
    env_args: dict[str, Any] = field(default_factory=dict)
    n_train: int = 0
    n_eval: int = 0
    eval_fraction: float = 0.1
    oracle: str = ""
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.env_id.strip():
            raise ValueError("env_id is required: the installed verifiers environment, e.g. vf-gsm8k")
        if self.n_train < 0 or self.n_eval < 0:
            raise ValueError(f"n_train and n_eval must be >= 0, got {self.n_train} and {self.n_eval}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be between 0 and 1, got {self.eval_fraction}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def import_verifiers() -> Any:
    """`verifiers` with its classic API, or one line saying how to install it."""
    try:
        import verifiers

        verifiers.MultiTurnEnv  # noqa: B018 - loads the classic API (absent from verifiers 0.4)
    except ModuleNotFoundError as err:
        raise MissingExtra(f"env.kind verifiers needs verifiers {VERSION}: {INSTALL}", name=err.name) from err
    except AttributeError:
        raise ValueError(f"env.kind verifiers: verifiers {getattr(verifiers, '__version__', '?')} has no classic "
                         f"environments (0.4 moved to verifiers.v1); {INSTALL}") from None  # fmt: skip
    return verifiers


def load_vf_environment(vf: Any, env_id: str, env_args: dict[str, Any]) -> Any:
    """`vf.load_environment(env_id, **env_args)`, looked up like ponder's import paths
    (sys.path, then the working directory). verifiers' Environment installs SIGINT and
    SIGTERM handlers of its own; ponder's (stop after the step) are put back."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    in_main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    try:
        env = vf.load_environment(env_id, **env_args)
    except (ValueError, RuntimeError, TypeError) as err:
        cause = err.__cause__ or err
        raise ValueError(f"env.options.env_id {env_id!r}: {str(err).splitlines()[0]} "
                         f"({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})") from None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if not isinstance(env, vf.MultiTurnEnv):
        raise ValueError(f"env.options.env_id {env_id!r}: a {type(env).__name__}, not a verifiers MultiTurnEnv "
                         "(SingleTurnEnv, ToolEnv, StatefulToolEnv … are): ponder steps those")  # fmt: skip
    if env.rubric.has_group_rewards:
        names = [n for n, f in zip(env.rubric._get_reward_func_names(), env.rubric._get_reward_funcs())
                 if env.rubric._is_group_func(f)]  # fmt: skip
        raise ValueError(f"env.options.env_id {env_id!r}: its rubric's {names} score a whole group of rollouts "
                         "at once; ponder scores each episode on its own")  # fmt: skip
    return env


def message_text(content: Any) -> str:
    """A verifiers message's content as text (the text parts of a multi-part content)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [p.get("text") if isinstance(p, dict) else getattr(p, "text", None) for p in content]
    return "".join(p for p in parts if isinstance(p, str))


def plain_message(message: Any) -> dict[str, str]:
    """A verifiers message (pydantic or dict) as ponder's `{"role", "content"}`; tool
    results in Hermes' <tool_response> block, as the tools prompt says they come."""
    get = message.get if isinstance(message, dict) else lambda key, default=None: getattr(message, key, default)
    role, text = str(get("role", "user") or "user"), message_text(get("content"))
    if role == "tool":
        text = f"<tool_response>\n{text}\n</tool_response>"
    elif role == "text":  # a completion-style prompt
        role = "user"
    return {"role": role, "content": text}


def tool_specs(tools: list[Any]) -> list[ToolSpec]:
    """verifiers' tool definitions (`vf.Tool`) as ponder ToolSpecs."""
    return [ToolSpec(str(t.name), str(t.description or ""), dict(t.parameters or {})) for t in tools or []]


def with_tools(messages: list[dict[str, str]], specs: list[ToolSpec]) -> list[dict[str, str]]:
    """The messages with the tools listed in the system message (the prompt shows the
    model what it may call: ponder's chat encoding passes no `tools` to the template)."""
    if not specs:
        return messages
    listed = "\n".join(json.dumps({"name": s.name, "description": s.description, "parameters": s.parameters},
                                  ensure_ascii=False) for s in specs)  # fmt: skip
    text = TOOLS_PROMPT.format(tools=listed)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


@functools.cache
def client_class() -> type:
    """A `vf.Client` whose model is a ponder episode: `get_native_response` waits for
    the action the policy generated for the prompt (verifiers' own client seam)."""
    from verifiers.legacy.clients import Client

    class PonderClient(Client):
        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                                      **kwargs: Any) -> Any:  # fmt: skip
            return await self.client.ask(prompt, tools or [])

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return PonderClient


def vf_response(action: str, calls: list[ToolCall], turn: int) -> Any:
    """The policy's action as verifiers' Response: its text, and its tool calls when it made some."""
    from verifiers.legacy.types import Response, ResponseMessage
    from verifiers.legacy.types import ToolCall as VfToolCall

    tool_calls = [VfToolCall(id=f"call_{turn}_{i}", name=c.name, arguments=json.dumps(c.arguments))
                  for i, c in enumerate(calls)] or None  # fmt: skip
    message = ResponseMessage(content=action, tool_calls=tool_calls, is_truncated=False,
                              finish_reason="tool_calls" if tool_calls else "stop")  # fmt: skip
    return Response(id=f"ponder-{uuid.uuid4().hex}", created=int(time.time()), model="ponder", message=message)


class VerifiersEnvFactory:
    """Fresh episodes of one loaded verifiers environment, and the event-loop thread
    their rollouts run on. `close()` stops the thread; the next episode starts it again
    (a trainer closes its factory when training ends, and the evaluation may follow).
    The environment's own teardown runs at exit, as verifiers registers it."""

    def __init__(self, env: Any, env_id: str, tokenizer: Any, timeout_s: float) -> None:
        self.env, self.env_id, self.tokenizer, self.timeout_s = env, env_id, tokenizer, timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def __call__(self) -> VerifiersEpisode:
        if self.thread is None or not self.thread.is_alive():
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self.loop.run_forever, name=f"verifiers:{self.env_id}", daemon=True)
            self.thread.start()
        return VerifiersEpisode(self, self.loop)

    def close(self) -> None:
        if self.thread is not None and self.thread.is_alive() and self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        self.thread = None


class VerifiersEpisode(BaseEnv):
    """One rollout of the verifiers environment, stepped by ponder's engine: `reset`
    starts the environment's own rollout and returns the prompt of its first model turn;
    each `step` hands over the policy's action and returns what the environment
    answered (its env_response, in the chat template), until its rollout ends."""

    def __init__(self, factory: VerifiersEnvFactory, loop: asyncio.AbstractEventLoop) -> None:
        self.factory, self.loop = factory, loop
        self.stop_strings: list[str] = []
        self.events: queue.Queue = queue.Queue()
        self.rollout: concurrent.futures.Future | None = None
        self.pending: asyncio.Future | None = None
        self.history: list[dict[str, str]] = []
        self.calls: list[ToolCall] = []
        self.parser = HermesParser()
        self.specs: list[ToolSpec] = []  # the tools of the current turn (verifiers may change them)
        self.turns = 0

    def reset(self, task: Task) -> Opening:
        row = task.metadata.get("verifiers")
        if not isinstance(row, dict):
            raise ValueError(f"task {task.id}: no verifiers row in its metadata (env.kind verifiers trains on "
                             "its environment's own dataset)")  # fmt: skip
        self.rollout = asyncio.run_coroutine_threadsafe(self._run(dict(row)), self.loop)
        kind, payload = self._next()
        if kind != "prompt":
            raise ValueError(f"verifiers env {self.factory.env_id}: the rollout of task {task.id} ended before "
                             f"the model's first turn ({_ended(kind, payload)})")  # fmt: skip
        self.history = payload[0]
        return Opening(self.history, payload[1])

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        index, self.turns = self.turns, self.turns + 1
        parse = self.parser.parse(action) if self.specs else None
        self.calls = list(parse.calls) if parse is not None and parse.error is None else []
        pending = self.pending
        self.loop.call_soon_threadsafe(_resolve, pending, action)
        kind, payload = self._next()
        turn = Turn(index, action, tool_calls=list(self.calls))
        if kind == "prompt":
            messages = payload[0]
            if len(messages) <= len(self.history):
                raise ValueError(f"verifiers env {self.factory.env_id}: its next prompt does not extend the "
                                 "conversation; ponder appends each turn to one context")  # fmt: skip
            observation = continuation(self.factory.tokenizer, self.history, action, messages[len(self.history) + 1:])
            self.history, turn.observation = messages, observation
            return observation, False, {"turn": turn}
        if kind == "error":
            raise RuntimeError(f"verifiers env {self.factory.env_id}: {_ended(kind, payload)}")
        return None, True, self._finished(payload, turn)

    def close(self) -> None:
        """A rollout ponder ended first (its token budget) is cancelled: verifiers runs its cleanup."""
        if self.rollout is not None and not self.rollout.done():
            self.rollout.cancel()
            concurrent.futures.wait([self.rollout], timeout=10)

    async def ask(self, prompt: Any, tools: list[Any]) -> Any:
        """The client's side (on the loop thread): post the prompt, wait for the action."""
        self.pending = asyncio.get_running_loop().create_future()
        self.specs = tool_specs(tools)
        messages = with_tools([plain_message(m) for m in prompt], self.specs)
        self.events.put(("prompt", (messages, self.specs)))
        action = await self.pending
        return vf_response(action, self.calls, self.turns)

    async def _run(self, row: dict[str, Any]) -> None:
        env = self.factory.env
        try:
            state = await env.rollout(row, client_class()(self), "ponder", {})
            await env.rubric.score_group([state])
            await env.rubric.cleanup(state)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - reported to the episode, which raises it
            self.events.put(("error", err))
            return
        self.events.put(("done", state))

    def _next(self) -> tuple[str, Any]:
        try:
            return self.events.get(timeout=self.factory.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"verifiers env {self.factory.env_id}: no turn or result within "
                               f"{self.factory.timeout_s:g} s (env.options.timeout_s)") from None  # fmt: skip

    def _finished(self, state: Any, turn: Turn) -> dict[str, Any]:
        """The last turn's info: the rubric's scores as metrics, the stop reason, the answer."""
        metrics = {METRIC + name: float(value) for name, value in (state.get("metrics") or {}).items()}
        metrics[METRIC + "reward"] = float(state.get("reward") or 0.0)
        if not turn.tool_calls:
            turn.answer = turn.action.strip() or None
        if state.get("error") is not None:
            turn.error = f"{type(state['error']).__name__}: {state['error']}"
        condition = str(state.get("stop_condition") or "done")
        reason = STOP_REASONS.get(condition, condition)
        if condition == "max_turns_reached" and getattr(self.factory.env, "max_turns", 0) == 1:
            reason = "answer"  # a SingleTurnEnv: its one turn is the answer
        return {"turn": turn, "metrics": metrics, "stop_reason": reason}


def _resolve(pending: asyncio.Future | None, action: str) -> None:
    if pending is not None and not pending.done():
        pending.set_result(action)


def _ended(kind: str, payload: Any) -> str:
    if kind == "error":
        return f"{type(payload).__name__}: {str(payload).splitlines()[0] if str(payload) else ''}"
    return f"stop condition {payload.get('stop_condition')}, error {payload.get('error')}"


@dataclass(frozen=True)
class RubricTerm:
    """One function of the environment's rubric as a ponder reward component: the score
    verifiers' rubric gave the episode (None when ponder ended it before the environment)."""

    name: str

    def __call__(self, trajectory: Trajectory, task: Task) -> float | None:
        value = trajectory.metrics.get(METRIC + self.name)
        return None if value is None else float(value)


def row_task(row: dict[str, Any], split: str, env_id: str, oracle: str) -> Task:
    """A dataset row (after verifiers formatted it: `prompt`, `example_id`, …) as a Task;
    the row itself rides in metadata["verifiers"] for the rollout."""
    prompt = row.get("prompt") or []
    users = [message_text(m.get("content")) for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    answer = row.get("answer")
    oracle_actions = []
    if oracle:
        try:
            oracle_actions = [oracle.format_map(row)]
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"env.options.oracle {oracle!r}: {type(err).__name__} {err} (columns: "
                             f"{', '.join(sorted(row))})") from None  # fmt: skip
    plain = json.loads(json.dumps(row, default=str))
    return Task(f"{split}-{row.get('example_id')}", users[-1] if users else json.dumps(prompt, default=str)[:500],
                [str(answer)] if answer not in (None, "") else [], kind=_kind(row, env_id),
                oracle_actions=oracle_actions, metadata={"verifiers": plain})  # fmt: skip


def _kind(row: dict[str, Any], env_id: str) -> str:
    """The task kind evaluation reports apart: a row's `task` name (older verifiers
    environments route by it), else the environment's id."""
    task = row.get("task")
    return task if isinstance(task, str) and task else env_id


def vf_splits(env: Any, options: VerifiersOptions) -> tuple[list[Task], list[Task]]:
    """The environment's dataset and eval_dataset as train and eval tasks (the last
    eval_fraction of the dataset when it has no eval_dataset)."""
    has_train = env.dataset is not None or getattr(env, "dataset_source", None) is not None
    has_eval = env.eval_dataset is not None or getattr(env, "eval_dataset_source", None) is not None
    train = [dict(r) for r in env.get_dataset()] if has_train else []
    if has_eval:
        evaluation = [dict(r) for r in env.get_eval_dataset()]
    else:
        held = max(1, round(len(train) * options.eval_fraction)) if len(train) > 1 else 0
        train, evaluation = train[: len(train) - held], train[len(train) - held:]
    train = train[: options.n_train] if options.n_train else train
    evaluation = evaluation[: options.n_eval] if options.n_eval else evaluation
    make = functools.partial(row_task, env_id=options.env_id, oracle=options.oracle)
    return [make(r, "train") for r in train], [make(r, "eval") for r in evaluation]


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    from datasets.utils import logging as datasets_logging

    shown = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            datasets_logging.enable_progress_bar()


@register_env("verifiers")
def build_verifiers(ctx: EnvContext) -> EnvSpec:
    """An installed verifiers environment (see the module docstring).

    env.options: env_id (required), env_args, n_train, n_eval, eval_fraction, oracle,
    timeout_s (VerifiersOptions). Reward components: one per rubric function, named as
    the function, at the rubric's weight (a weight-0 metric is logged, not paid)."""
    options = from_dict(VerifiersOptions, dict(ctx.options), "env.kind verifiers", "env.options.")
    vf = import_verifiers()
    with _quiet_datasets():  # verifiers formats its datasets with map(): no progress bars in ponder's output
        env = load_vf_environment(vf, options.env_id, dict(options.env_args))
        train, evaluation = vf_splits(env, options)
    if not train and not evaluation:
        raise ValueError(f"env.options.env_id {options.env_id!r}: its dataset and eval_dataset are empty")
    weights: dict[str, float] = {}
    for name, weight in zip(env.rubric._get_reward_func_names(), env.rubric._get_reward_weights()):
        weights[name] = weights.get(name, 0.0) + float(weight)
    rewards = {name: RubricTerm(name) for name in weights}
    factory = VerifiersEnvFactory(env, options.env_id, ctx.tokenizer, options.timeout_s)
    return EnvSpec(factory, train, evaluation, rewards, weights)
