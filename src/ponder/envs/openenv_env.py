"""`env.kind: openenv`: an OpenEnv environment server as a ponder environment.

OpenEnv (Meta's and Hugging Face's format) serves an environment over HTTP and
WebSocket: a session per WebSocket, `reset(**kwargs)` and `step(action)` returning an
observation with `reward` and `done`, and the schemas of its Action and Observation at
`/schema`. Each ponder episode is one session through OpenEnv's own client
(`GenericEnvClient`): `reset` shows the first observation as the prompt, each action
of the policy fills the Action's text field (or, for an Action of several fields, is
read as a JSON object of them) and is stepped; the observation comes back as a user
turn in the policy's chat template, its reward is the turn's reward, `done` ends the
episode.

Tasks come from the server's Task API when it has one (`/{env}/splits`, `/{env}/tasks`;
each episode resets with its task's `split` and `index`), else from seeds (`reset(seed=N)`,
train and eval seeds disjoint). The server is reached at `env.options.url`, or started
by `env.options.command` on 127.0.0.1 at a free port and stopped with the run.

openenv 0.10.0 pins `fastmcp<4` (its MCP mode), whose `mcp<2` excludes ponder's own
`mcp==2.3.0`; it is installed beside ponder[envs] (which brings fastmcp 4, with which its
modules import) with `--no-deps`. Its simulation mode, which this adapter speaks, needs
only FastAPI, uvicorn, websockets and pydantic.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ponder.config.load import from_dict
from ponder.envs.base import BaseEnv, EnvContext, EnvSpec, Opening, register_env
from ponder.envs.chat_turns import continuation
from ponder.extras import MissingExtra
from ponder.types import Task, Turn

VERSION = "0.10.0"
INSTALL = f"pip install 'ponder[envs]' && pip install --no-deps openenv=={VERSION}"
JSON_ACTION = "Write each action as a JSON object with the fields {fields}."
logger = logging.getLogger(__name__)


@dataclass
class OpenEnvOptions:
    """env.options of `openenv`.

    url: a running OpenEnv server (`http://127.0.0.1:8000`).
    command: instead, the command that starts one (a list, or one string split like a
        shell's); `{port}` is replaced by a free port on 127.0.0.1 (also in $PORT) and
        `{python}` by this interpreter. It runs in the working directory and is stopped
        when the run ends.
    start_timeout_s: how long the started server may take to answer /health.
    system: a system message before the first observation (the rules, the format).
    action_field: the Action field the policy's text fills (default: its one text field;
        an Action with no or several text fields is read as a JSON object of its fields).
    observation_field: the Observation field shown (default: its one text field, else
        the observation's fields as JSON).
    stop: stop strings of one action (e.g. `</guess>`).
    train_split / eval_split: the Task API splits (default: its `train` one and a `test`
        or `validation` one).
    n_train / n_eval: tasks per split (0 = all of the Task API's; without one, episodes
        are seeds and 0 means 64 / 16).
    seed: the first seed, without a Task API (eval seeds follow the train ones).
    oracle_key: a key of the Task API's task specs holding reference actions (a list
        of texts): the demo's ceiling and the SFT warm-up's demonstrations.
    max_turns: actions per episode (0 = the recipe's env.max_turns).
    timeout_s: the longest one reset or step may take.
    """

    url: str = ""
    command: list[str] | str = field(default_factory=list)
    start_timeout_s: float = 60.0
    system: str = ""
    action_field: str = ""
    observation_field: str = ""
    stop: list[str] = field(default_factory=list)
    train_split: str = ""
    eval_split: str = ""
    n_train: int = 0
    n_eval: int = 0
    seed: int = 0
    oracle_key: str = ""
    max_turns: int = 0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if bool(self.url) == bool(self.command):
            raise ValueError("give exactly one of url (a running OpenEnv server) and command (one to start)")
        if self.url and urlsplit(self.url).scheme not in ("http", "https", "ws", "wss"):
            raise ValueError(f"url must be http(s):// or ws(s)://, got {self.url!r}")
        for name in ("n_train", "n_eval", "seed", "max_turns"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.start_timeout_s <= 0 or self.timeout_s <= 0:
            raise ValueError("start_timeout_s and timeout_s must be > 0")


def import_openenv() -> Any:
    """OpenEnv's generic client class, or one line saying how to install it."""
    try:
        from openenv.core import GenericEnvClient
    except ModuleNotFoundError as err:
        raise MissingExtra(f"env.kind openenv needs openenv {VERSION}: {INSTALL}", name=err.name) from err
    return GenericEnvClient


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServerProcess:
    """An OpenEnv server started from env.options.command on 127.0.0.1; `stop()` ends
    its whole process group."""

    def __init__(self, command: list[str] | str, timeout_s: float) -> None:
        argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
        if not argv:
            raise ValueError("env.options.command for openenv: empty")
        port = free_port()
        self.argv = [part.replace("{port}", str(port)).replace("{python}", sys.executable) for part in argv]
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        try:
            self.process = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=os.getcwd(),
                                            env={**os.environ, "PORT": str(port)}, start_new_session=True)  # fmt: skip
        except OSError as err:
            raise ValueError(f"env.options.command for openenv: cannot start {self.argv[0]!r} ({err})") from None
        atexit.register(self.stop)  # a run that never closed its environment still ends the server
        self._wait(timeout_s)

    def _wait(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ValueError(f"env.options.command for openenv: the server exited with code "
                                 f"{self.process.returncode} before answering ({self._tail()})")  # fmt: skip
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ValueError(f"env.options.command for openenv: no answer at {self.url}/health within {timeout_s:g} s "
                         f"(env.options.start_timeout_s; {self._tail()})")  # fmt: skip

    def _tail(self) -> str:
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        return f"its last output: {lines[-1][:300]}" if lines else "no output"

    def stop(self) -> None:
        if self.log.closed:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except ProcessLookupError:
                pass
        self.log.close()


def http_json(method: str, url: str, body: Any = None, timeout_s: float = 30.0) -> Any:
    """One JSON request to the server: the decoded answer, or None for a 404 / 501 (a route it lacks)."""
    import httpx

    try:
        answer = httpx.request(method, url, json=body, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise ValueError(f"env.kind openenv: {method} {url} failed ({type(err).__name__}: {err})") from None
    if answer.status_code in (404, 405, 501):
        return None
    if answer.status_code >= 400:
        raise ValueError(f"env.kind openenv: {method} {url} answered {answer.status_code}: {answer.text[:300]}")
    return answer.json()


def text_fields(schema: dict[str, Any], skip: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The names of a JSON Schema object's string properties, and of all its properties, minus `skip`."""
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k not in skip}
    return [k for k, v in properties.items() if v.get("type") == "string"], list(properties)


def action_field_of(schema: dict[str, Any], wanted: str) -> str:
    """The Action field the policy's text fills; "" = the action is a JSON object of its fields."""
    strings, names = text_fields(schema, ("metadata",))
    if wanted:
        if wanted not in names:
            raise ValueError(f"env.options.action_field {wanted!r}: the server's Action has the fields "
                             f"{', '.join(names) or 'none'}")  # fmt: skip
        return wanted
    return strings[0] if len(strings) == 1 and len(names) == 1 else ""


def observation_field_of(schema: dict[str, Any], wanted: str) -> str:
    """The Observation field shown to the policy; "" = all its fields as JSON."""
    strings, names = text_fields(schema, ("metadata", "done", "reward"))
    if wanted:
        if wanted not in names:
            raise ValueError(f"env.options.observation_field {wanted!r}: the server's Observation has the fields "
                             f"{', '.join(names) or 'none'}")  # fmt: skip
        return wanted
    return strings[0] if len(strings) == 1 else ""


def _task(split: str, index: int, reset: dict[str, Any], spec: dict[str, Any], options: OpenEnvOptions) -> Task:
    oracle = spec.get(options.oracle_key) if options.oracle_key else None
    if options.oracle_key and not (isinstance(oracle, list) and all(isinstance(a, str) for a in oracle)):
        raise ValueError(f"env.options.oracle_key {options.oracle_key!r}: task {split}/{index} holds no list of "
                         f"texts there (keys: {', '.join(sorted(spec)) or 'none'})")  # fmt: skip
    question = str(spec.get("question") or spec.get("prompt") or spec.get("id") or f"{split}-{index}")
    return Task(f"{split}-{index}", question, [], kind=split, oracle_actions=list(oracle or []),
                metadata={"openenv_reset": reset, "openenv_task": spec})  # fmt: skip


def server_tasks(url: str, options: OpenEnvOptions) -> tuple[list[Task], list[Task]]:
    """Train and eval tasks from the server's Task API, or seeds when it has none."""
    names = http_json("GET", f"{url}/list_environments", timeout_s=options.timeout_s)
    splits = http_json("GET", f"{url}/{names[0]}/splits", timeout_s=options.timeout_s) if names else None
    if not splits:
        n_train, n_eval = options.n_train or 64, options.n_eval or 16
        seeds = range(options.seed, options.seed + n_train + n_eval)
        tasks = [_task("seed", s, {"seed": s}, {}, options) for s in seeds]
        return tasks[:n_train], tasks[n_train:]
    by_type = {str(s.get("type")): str(s.get("name")) for s in reversed(splits)}
    known = [str(s.get("name")) for s in splits]
    train = options.train_split or by_type.get("train", "")
    evaluation = options.eval_split or by_type.get("test") or by_type.get("validation", "")
    for key, name in (("train_split", train), ("eval_split", evaluation)):
        if name not in known:
            raise ValueError(f"env.options.{key} {name!r}: the server's splits are {', '.join(known)}")
    out = []
    for name, cap in ((train, options.n_train), (evaluation, options.n_eval)):
        specs = (http_json("POST", f"{url}/{names[0]}/tasks", {"split": name}, options.timeout_s) or {}).get("tasks")
        specs = [s if isinstance(s, dict) else {"task": s} for s in specs or []][: cap or None]
        out.append([_task(name, i, {"split": name, "index": int(s.get("index", i))}, s, options)
                    for i, s in enumerate(specs)])  # fmt: skip
    return out[0], out[1]


@dataclass
class OpenEnvSession:
    """How one episode talks to the server (built once from the options and /schema)."""

    url: str
    action_field: str
    observation_field: str
    system: str
    stop: list[str]
    max_turns: int
    timeout_s: float
    action_names: list[str] = field(default_factory=list)


class OpenEnvFactory:
    """Fresh episodes against one server. `close()` stops a server it started; the next
    episode starts it again (a trainer closes its factory when training ends, and the
    evaluation may follow)."""

    def __init__(self, session: OpenEnvSession, tokenizer: Any, server: ServerProcess | None,
                 command: list[str] | str = "", start_timeout_s: float = 60.0) -> None:  # fmt: skip
        self.session, self.tokenizer, self.server = session, tokenizer, server
        self.command, self.start_timeout_s = command, start_timeout_s
        self.client_class = import_openenv()

    def __call__(self) -> OpenEnvEpisode:
        if self.command and self.server is None:
            self.server = ServerProcess(self.command, self.start_timeout_s)
            self.session.url = self.server.url
        return OpenEnvEpisode(self)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class OpenEnvEpisode(BaseEnv):
    """One session on the server: reset shows its observation, each action is a step."""

    def __init__(self, factory: OpenEnvFactory) -> None:
        self.factory, self.session = factory, factory.session
        self.stop_strings = list(self.session.stop)
        self.client: Any = None
        self.history: list[dict[str, str]] = []
        self.turns = 0

    def reset(self, task: Task) -> Opening:
        reset = task.metadata.get("openenv_reset")
        if not isinstance(reset, dict):
            raise ValueError(f"task {task.id}: no openenv_reset in its metadata (env.kind openenv makes its tasks "
                             "from the server)")  # fmt: skip
        self.client = self.factory.client_class(base_url=self.session.url,
                                                message_timeout_s=self.session.timeout_s).sync()  # fmt: skip
        try:
            result = self.client.reset(**reset)
        except (RuntimeError, ConnectionError) as err:
            raise ValueError(f"env.kind openenv: the server at {self.session.url} refused a session ({err}); "
                             "does it allow as many concurrent sessions as rollout.batch_size?") from None  # fmt: skip
        system = self.session.system
        if not self.session.action_field:
            system = (system + "\n\n" if system else "") + JSON_ACTION.format(fields=self._action_fields())
        self.history = [{"role": "system", "content": system}] if system else []
        self.history.append({"role": "user", "content": self._shown(result.observation)})
        self.turns = 0
        return Opening(list(self.history))

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        self.turns += 1
        turn = Turn(self.turns - 1, action)
        payload, error = self._payload(action)
        if error is not None:  # not an action at all: told, never sent
            turn.error = error
            shown, reward, done = f"error: {error}", 0.0, False
        else:
            result = self.client.step(payload)
            shown, reward, done = self._shown(result.observation), float(result.reward or 0.0), bool(result.done)
        info: dict[str, Any] = {"turn": turn, "reward": reward, "metrics": {"openenv/return": reward}}
        if done or self.turns >= self.session.max_turns:
            turn.answer = action.strip() if done else None
            return None, True, {**info, "stop_reason": "done" if done else "max_turns"}
        user = {"role": "user", "content": shown}
        at_stop = any(action.endswith(stop) for stop in self.stop_strings)  # no end-of-turn token then
        observation = continuation(self.factory.tokenizer, self.history, action, [user], ended_at_eos=not at_stop)
        self.history += [{"role": "assistant", "content": action}, user]
        turn.observation = observation
        return observation, False, info

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            finally:
                self.client = None

    def _shown(self, observation: Any) -> str:
        fields = dict(observation or {})
        if self.session.observation_field:
            return str(fields.get(self.session.observation_field, ""))
        fields.pop("metadata", None)
        return json.dumps(fields, ensure_ascii=False, default=str)

    def _action_fields(self) -> str:
        return ", ".join(self.session.action_names)

    def _payload(self, action: str) -> tuple[dict[str, Any] | None, str | None]:
        if self.session.action_field:
            return {self.session.action_field: action}, None
        try:
            payload = json.loads(action.strip())
        except json.JSONDecodeError as err:
            return None, f"the action is not JSON ({err.msg}); write a JSON object with {self._action_fields()}"
        if not isinstance(payload, dict):
            return None, f"the action must be a JSON object with {self._action_fields()}"
        return payload, None


@register_env("openenv")
def build_openenv(ctx: EnvContext) -> EnvSpec:
    """An OpenEnv environment server (see the module docstring).

    env.options (OpenEnvOptions): url or command, start_timeout_s, system, action_field,
    observation_field, stop, train_split, eval_split, n_train, n_eval, seed, oracle_key,
    max_turns, timeout_s. Reward: each step's reward (`turn_rewards`, weight 1), summed
    over the episode; `openenv/return` in the metrics."""
    options = from_dict(OpenEnvOptions, dict(ctx.options), "env.kind openenv", "env.options.")
    import_openenv()
    server = ServerProcess(options.command, options.start_timeout_s) if options.command else None
    url = server.url if server is not None else options.url.rstrip("/")
    try:
        schema = http_json("GET", f"{url}/schema", timeout_s=options.timeout_s)
        if not isinstance(schema, dict) or "action" not in schema:
            raise ValueError(f"env.kind openenv: {url}/schema gives no Action schema: is it an OpenEnv server?")
        train, evaluation = server_tasks(url, options)
        if not train and not evaluation:
            raise ValueError(f"env.kind openenv: the server at {url} has no tasks in its splits")
        default_turns = ctx.recipe.env.max_turns if ctx.recipe is not None else 6
        session = OpenEnvSession(url, action_field_of(schema["action"], options.action_field),
                                 observation_field_of(schema.get("observation") or {}, options.observation_field),
                                 options.system, list(options.stop), options.max_turns or default_turns,
                                 options.timeout_s, text_fields(schema["action"], ("metadata",))[1])  # fmt: skip
    except BaseException:
        if server is not None:
            server.stop()
        raise
    factory = OpenEnvFactory(session, ctx.tokenizer, server, options.command, options.start_timeout_s)
    return EnvSpec(factory, train, evaluation, {}, {"turn_rewards": 1.0})
