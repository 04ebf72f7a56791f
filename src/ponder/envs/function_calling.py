"""Function calling on the Berkeley Function Calling Leaderboard's non-live single-turn
questions, scored by BFCL's own AST checker.

One episode is one question: the system message lists the question's own functions
(as BFCL offers them) as JSON Schemas and the output format, and the policy's first
action ends it. A call is written `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(Hermes, one per call); a question no function answers (irrelevance) wants a plain
reply. Nothing runs: the reward is BFCL's verdict on the calls, from its checker in
bfcl-eval's own venv (`make bfcl-venv`), through one worker process per run.

Only the non-live single-turn categories are read (`CATEGORIES`); the live and
multi-turn data are never read, so they stay a clean test of generalisation. Tasks
are split by question into train and test with a seeded hash of the question id:
the same split every run, whatever the caps and categories.

Options (env.options):
  categories: a subset of CATEGORIES (default all five).
  test_fraction: share of each category's questions held out (default 0.3).
  seed: the split's seed (default 0).
  n_train / n_eval: at most this many questions per category in each split, in data
      order (0 = all); a mapping category → cap sets them one by one (unnamed: all),
      e.g. to give irrelevance its BFCL share of a warm-up. A category it names that
      `categories` leaves out is ignored, so `env.options.categories=[...]` alone
      narrows a recipe: `ponder eval --recipe recipes/function_calling.yaml --model RUN
      env.options.categories=[parallel,parallel_multiple]` evaluates a trained adapter
      on the categories it never saw, in its own prompt format.
  max_description_chars: cut function and argument descriptions to this many
      characters in the prompt (0 = whole); they are most of a prompt's length.
  plan: open the reference solver's reply (the warm-up's demonstrations) with a thought
      naming the functions that fit, or none: `<think>Fits: get_area.</think>` then
      the calls, `<think>Fits: none.</think>` then the refusal (default false). The
      call-or-decline choice then sits at one place in the reply, as the lookup count
      does in search-QA's plan (`env.options.taskgen.plan`).
  venv: bfcl-eval's virtual environment (default .venv-bfcl).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import threading
from dataclasses import dataclass, field, fields
from typing import Any

from ponder.envs.base import EnvContext, EnvSpec, Opening, register_env
from ponder.tools.parsers import HermesParser
from ponder.types import Task, Trajectory, Turn

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
REFUSAL = "None of the given functions can answer this request."
INSTRUCTIONS = (
    "You can call the functions below; each is a JSON object with its name, description "
    "and the JSON Schema of its arguments.\n<functions>\n{functions}\n</functions>\n"
    "To call functions, reply with one line per call, exactly:\n"
    '<tool_call>{{"name": "function_name", "arguments": {{"argument": value}}}}</tool_call>\n'
    "Make every call the request needs, with the argument values it gives. If none of "
    "the functions can do what is asked, call none: reply in plain text that no function applies."
)


@dataclass
class FunctionCallingOptions:
    """The environment's options; see the module docstring."""

    categories: list[str] = field(default_factory=lambda: list(CATEGORIES))
    test_fraction: float = 0.3
    seed: int = 0
    n_train: int | dict[str, int] = 0
    n_eval: int | dict[str, int] = 0
    max_description_chars: int = 0
    plan: bool = False
    venv: str = ".venv-bfcl"

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> FunctionCallingOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"env.options for function_calling: unknown {unknown}; valid: {', '.join(sorted(known))}")
        parsed = cls(**options)
        parsed.categories = list(parsed.categories)
        wrong = [c for c in parsed.categories if c not in CATEGORIES]
        if wrong or not parsed.categories:
            raise ValueError(f"env.options.categories: {wrong or 'empty'} not allowed; choose from "
                             f"{', '.join(CATEGORIES)} (live and multi-turn data are never used)")  # fmt: skip
        if not 0.0 < parsed.test_fraction < 1.0:
            raise ValueError(f"env.options.test_fraction must be in (0, 1), got {parsed.test_fraction}")
        for name in ("n_train", "n_eval"):
            caps = getattr(parsed, name)
            caps = dict(caps) if isinstance(caps, dict) else {c: caps for c in parsed.categories}
            if set(caps) - set(CATEGORIES) or not all(isinstance(n, int) and n >= 0 for n in caps.values()):
                raise ValueError(f"env.options.{name}: {getattr(parsed, name)!r}; give a count >= 0 (0 = all) or a "
                                 f"mapping of categories ({', '.join(CATEGORIES)}) to counts")  # fmt: skip
            setattr(parsed, name, {c: n for c, n in caps.items() if c in parsed.categories})  # others: not chosen
        if parsed.max_description_chars < 0:
            raise ValueError("env.options.max_description_chars must be >= 0 (0 = whole descriptions)")
        return parsed

    def cap(self, split: str, category: str) -> int | None:
        """The slice end for `category` in `split` ("n_train" or "n_eval"): None = all."""
        caps = getattr(self, split)
        count = caps.get(category, 0) if isinstance(caps, dict) else caps
        return count or None


# --- tasks -------------------------------------------------------------------------------


def is_test_question(question_id: str, test_fraction: float, seed: int) -> bool:
    """A fixed, seeded coin per question id: the held-out split is by question."""
    digest = hashlib.sha256(f"function_calling:{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < test_fraction


def render_call(name: str, arguments: dict[str, Any]) -> str:
    """One call in the action format the prompt asks for."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def plan_line(names: list[str]) -> str:
    """The thought that opens a planned reply: the functions that fit, or none."""
    return f"<think>Fits: {', '.join(names) or 'none'}.</think>\n"


def question_task(question: Any, plan: bool = False) -> Task:
    """A Task from a BfclQuestion; the reference solver's action is its first possible
    answer, opened by `plan_line` when `plan`."""
    from ponder.bfcl.answers import reference_calls

    calls = reference_calls(question)
    action = "\n".join(render_call(name, arguments) for name, arguments in calls) if calls else REFUSAL
    if plan:
        action = plan_line(list(dict.fromkeys(name for name, _ in calls))) + action
    metadata = {"category": question.category, "messages": question.messages, "functions": question.functions,
                "ground_truth": question.ground_truth, "needs_search": False}  # fmt: skip
    return Task(question.id, question.query, [action], kind=question.category,
                oracle_actions=[action], metadata=metadata)  # fmt: skip


def interleave(groups: list[list[Task]]) -> list[Task]:
    """One task of each group in turn: any prefix (eval.episodes, sft.examples) spans every category."""
    out: list[Task] = []
    for index in range(max((len(g) for g in groups), default=0)):
        out.extend(group[index] for group in groups if index < len(group))
    return out


def load_function_calling_tasks(options: FunctionCallingOptions) -> tuple[list[Task], list[Task]]:
    """(train, eval) over the chosen categories, each capped per category."""
    from ponder.bfcl.data import find_data_dir, load_questions

    data_dir = find_data_dir(options.venv)
    train, held_out = [], []
    for category in options.categories:
        questions = load_questions(data_dir, category)
        test = [q for q in questions if is_test_question(q.id, options.test_fraction, options.seed)]
        rest = [q for q in questions if not is_test_question(q.id, options.test_fraction, options.seed)]
        train.append([question_task(q, options.plan) for q in rest[: options.cap("n_train", category)]])
        held_out.append([question_task(q, options.plan) for q in test[: options.cap("n_eval", category)]])
    return interleave(train), interleave(held_out)


# --- the prompt and the episode ----------------------------------------------------------


def _cut(text: Any, limit: int) -> Any:
    if not isinstance(text, str) or not limit or len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + "…"


def _cut_descriptions(node: Any, limit: int) -> Any:
    """A copy of a schema with every `description` cut to `limit` characters."""
    if isinstance(node, list):
        return [_cut_descriptions(item, limit) for item in node]
    if not isinstance(node, dict):
        return node
    return {k: _cut(v, limit) if k == "description" else _cut_descriptions(v, limit) for k, v in node.items()}


def function_specs(functions: list[dict[str, Any]], max_description_chars: int = 0) -> list[Any]:
    """The question's functions as ToolSpecs: BFCL's dialect ("dict", "float") as JSON
    Schema. The checker accepts an integer for a float in Python, so "number" loses nothing."""
    from ponder.bfcl.data import definition_to_spec

    specs = []
    for definition in functions:
        spec, reason = definition_to_spec(_cut_descriptions(definition, max_description_chars))
        if spec is None:
            raise ValueError(f"BFCL function {definition.get('name')!r}: {reason}")
        specs.append(spec)
    return specs


def build_messages(task: Task, specs: list[Any]) -> list[dict[str, Any]]:
    """The system message (functions and format) followed by the question's own chat."""
    listed = "\n".join(json.dumps({"name": s.name, "description": s.description, "parameters": s.parameters},
                                  ensure_ascii=False) for s in specs)  # fmt: skip
    system = INSTRUCTIONS.format(functions=listed)
    chat = [dict(m) for m in task.metadata.get("messages") or [{"role": "user", "content": task.question}]]
    if chat and chat[0].get("role") == "system":  # a question's own system text follows ours
        system += "\n\n" + str(chat.pop(0).get("content") or "")
    return [{"role": "system", "content": system}, *chat]


class FunctionCallingEnv:
    """One single-turn episode: the first action ends it; the turn records its calls."""

    def __init__(self, max_description_chars: int = 0) -> None:
        self.parser = HermesParser()
        self.stop_strings: list[str] = list(self.parser.stop_strings)
        self.max_description_chars = max_description_chars

    def reset(self, task: Task) -> Opening:
        specs = function_specs(task.metadata.get("functions") or [], self.max_description_chars)
        return Opening(build_messages(task, specs), specs)

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        parse = self.parser.parse(action)
        # The whole reply is the answer: a call is the answer to a function-calling request.
        answer = action.strip() if parse.error is None else None
        turn = Turn(0, action, tool_calls=parse.calls, answer=answer, error=parse.error)
        return None, True, {"turn": turn, "stop_reason": "answer" if parse.error is None else "invalid"}


# --- rewards: BFCL's checker through one shared worker -------------------------------------


def python_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Calls as a prompt-mode model writes them (`[f(a=1), g(b='x')]`), the text BFCL's own
    decoder reads; "" when there are none. The values are decoded JSON, whose Python reprs
    are literals of the same types, so the checker sees what the model wrote."""
    if not calls:
        return ""
    return "[" + ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for name, args in calls) + "]"


def python_call_text(turn: Turn) -> str:
    """The turn's calls in BFCL's text (`python_calls`)."""
    return python_calls([(call.name, call.arguments) for call in turn.tool_calls or []])


def argument_probes(arguments: dict[str, Any], reference: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each argument of one reference call (BFCL's answer: name → its possible values),
    the reply's arguments with every *other* reference argument set to an acceptable value
    (the reference solver's: `pick_arguments`). The reply's own value of that argument is
    kept (left out if it gave none), and so are arguments the reference does not name,
    which BFCL refuses. The checker accepts a probe exactly when the reply got that
    argument right and added nothing it should not."""
    from ponder.bfcl.answers import pick_arguments

    accepted = pick_arguments(reference)
    extra = {key: value for key, value in arguments.items() if key not in reference}
    probes = {}
    for name in reference:
        others = {key: value for key, value in accepted.items() if key != name}
        own = {name: arguments[name]} if name in arguments else {}
        probes[name] = others | own | extra
    return probes


class BfclChecker:
    """BFCL's verdicts from one worker process, started on first use and shared by every
    episode of the run (checks are ~0.1 ms each over the pipe: no process per episode)."""

    def __init__(self, venv: str) -> None:
        self.venv = venv
        self._bridge: Any = None
        self._lock = threading.Lock()

    def verdict(self, category: str, text: str, task: Task) -> dict[str, Any]:
        return self.verdicts(category, [text], task)[0]

    def verdicts(self, category: str, texts: list[str], task: Task) -> list[dict[str, Any]]:
        """The checker's verdict on each reply text to `task`, in one exchange."""
        items = [{"id": task.id, "text": text, "function": task.metadata.get("functions") or [],
                  "ground_truth": task.metadata.get("ground_truth") or []} for text in texts]  # fmt: skip
        with self._lock:
            if self._bridge is None:
                from ponder.bfcl.bridge import BfclBridge

                self._bridge = BfclBridge(self.venv).__enter__()
                atexit.register(self.close)
            return self._bridge.check(category, items)

    def close(self) -> None:
        with self._lock:
            if self._bridge is not None:
                self._bridge.close()
                self._bridge = None


_CHECKERS: dict[str, BfclChecker] = {}


def shared_checker(venv: str) -> BfclChecker:
    """The process's checker for `venv` (builders run once per stage; the worker once per run)."""
    from ponder.bfcl.bridge import bfcl_python

    bfcl_python(venv)  # fail now, in one line, if `make bfcl-venv` was not run
    return _CHECKERS.setdefault(venv, BfclChecker(venv))


class BfclReward:
    """1.0 when BFCL's checker accepts the episode's calls (right functions, arguments and
    types; for irrelevance, no call), else 0.0. A malformed call block scores 0 even on an
    irrelevance question: BFCL's decoder would count it as no call, and RL would learn
    to write broken calls instead of declining."""

    def __init__(self, checker: BfclChecker) -> None:
        self.checker = checker

    def __call__(self, trajectory: Trajectory, task: Task) -> float:
        if not trajectory.turns or trajectory.turns[0].error is not None:
            return 0.0
        category = task.metadata.get("category", task.kind)
        verdict = self.checker.verdict(category, python_call_text(trajectory.turns[0]), task)
        return 1.0 if verdict["valid"] else 0.0


def call_format(trajectory: Trajectory, task: Task) -> float:
    """1.0 when the reply parses: well-formed JSON call blocks, or plain non-empty text."""
    return 1.0 if trajectory.turns and trajectory.turns[0].error is None else 0.0


def right_choice(trajectory: Trajectory, task: Task) -> float:
    """1.0 when the reply calls exactly the functions the reference answer calls (by name,
    any arguments), or none where none applies (irrelevance); else 0.0. A shaping term for
    RL (weight 0 unless a recipe sets `reward.terms.choice`): with BFCL's checker alone, a
    call with one wrong argument scores what declining scores, so RL learns to decline
    questions it could call (docs/results/envs.md)."""
    if not trajectory.turns or trajectory.turns[0].error is not None:
        return 0.0
    called = sorted(call.name for call in trajectory.turns[0].tool_calls or [])
    wanted = sorted(name for call in task.metadata.get("ground_truth") or [] for name in call)
    return 1.0 if called == wanted else 0.0


class ArgumentsReward(BfclReward):
    """The share of the reference call's arguments the reply got right, each judged by
    BFCL's checker on `argument_probes` (partial credit, as ToolRL's fine-grained reward:
    four samples that all miss one value still differ in the others). 0 when the reply
    calls another function or is malformed; elsewhere (no reference call: irrelevance;
    several reference calls or several calls in the reply) the checker's own 1 / 0, as
    `bfcl`. A shaping term for RL (weight 0 unless a recipe sets `reward.terms.arguments`)."""

    def __call__(self, trajectory: Trajectory, task: Task) -> float:
        reference = task.metadata.get("ground_truth") or []
        calls = (trajectory.turns[0].tool_calls or []) if trajectory.turns else []
        if len(reference) != 1 or len(calls) != 1 or trajectory.turns[0].error is not None:
            return super().__call__(trajectory, task)
        (name, wanted), call = next(iter(reference[0].items())), calls[0]
        if call.name != name:
            return 0.0
        probes = argument_probes(call.arguments, wanted) or {"": call.arguments}
        texts = [python_calls([(name, args)]) for args in probes.values()]
        verdicts = self.checker.verdicts(task.metadata.get("category", task.kind), texts, task)
        return sum(verdict["valid"] for verdict in verdicts) / len(verdicts)


@register_env("function_calling")
def build_function_calling(ctx: EnvContext) -> EnvSpec:
    """BFCL's non-live single-turn questions; reward `bfcl` (BFCL's AST checker, weight 1),
    `format` (weight 0.1), `choice` (weight 0: the right functions called, or none) and
    `arguments` (weight 0: the share of the reference's arguments right)."""
    options = FunctionCallingOptions.from_dict(dict(ctx.options))
    checker = shared_checker(options.venv)
    train, held_out = load_function_calling_tasks(options)
    rewards = {"bfcl": BfclReward(checker), "format": call_format, "choice": right_choice,
               "arguments": ArgumentsReward(checker)}  # fmt: skip
    return EnvSpec(lambda: FunctionCallingEnv(options.max_description_chars), train, held_out, rewards,
                   {"bfcl": 1.0, "format": 0.1})  # fmt: skip
