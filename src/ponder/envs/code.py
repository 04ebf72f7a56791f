"""Write-a-function coding tasks checked by hidden unit tests run in the sandbox.

The model answers with its code in `<answer>```python … ```</answer>` (a bare
```python block is accepted as an answer too; the `format` reward is the strict
one). In multi-turn mode it may first `<run>```python … ```</run>` code: the code
runs on the examples shown in the question and what each call returned, raised and
printed comes back in `<output>…</output>`. Single-turn mode: the first action is
the answer.

An answer is checked by one sandbox run over all the task's hidden tests
(ponder.envs.code_harness); the share that passed is the answer turn's reward, and
the reward components (ponder.rewards.code) read it from there. Tasks are
generated offline (ponder.envs.code_tasks); a task file works too when each task's
metadata carries `function`, `tests` ([{"args": [...], "expected": ...}]) and
`examples` (how many of the tests the question shows).

All episodes of one built environment share one sandbox pool, started when the
environment is built and closed when it is dropped or the process exits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from ponder.envs.base import EnvContext, EnvSpec, Opening, register_env
from ponder.envs.code_harness import SandboxSettings, SharedSandbox, render_report, run_tests
from ponder.envs.code_tasks import TaskConfig, code_splits
from ponder.rewards.code import all_pass, code_format, hidden_tests_passed
from ponder.types import Task, ToolCall, ToolResult, ToolSpec, Turn

FENCE_EXAMPLE = "```python\n...\n```"
SINGLE_TURN = (
    "Write the Python function the user asks for. Reply with its code only, as\n"
    f"<answer>\n{FENCE_EXAMPLE}\n</answer>\nIt is checked with hidden unit tests."
)
MULTI_TURN = (
    "Write the Python function the user asks for. To try code on the examples first, write\n"
    f"<run>\n{FENCE_EXAMPLE}\n</run>\nwhat each example returns comes back in <output></output> "
    "(at most {runs} runs). Then reply with the final code as\n"
    f"<answer>\n{FENCE_EXAMPLE}\n</answer>\nIt is checked with hidden unit tests."
)
RUN_TOOL = ToolSpec(
    "run",
    "Run Python code on the task's examples; returns what each call returned or raised and what the code printed.",
    {"type": "object", "properties": {"code": {"type": "string", "description": "the code, defining the function"}},
     "required": ["code"]},
)  # fmt: skip
# Tests pass at 1.0; the format bonus keeps answers in the tag that ends generation;
# all_pass is the headline number, logged at weight 0 (give it weight in reward.terms).
REWARD_WEIGHTS = {"tests_passed": 1.0, "all_pass": 0.0, "format": 0.1}
CUT_MARK = "\n…[cut]"

_TAG = re.compile(r"<(run|answer)>")
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_PYTHON_LABELS = ("", "python", "py", "python3")


def answer_action(code: str) -> str:
    return f"<answer>\n```python\n{code.rstrip()}\n```\n</answer>"


def run_action(code: str) -> str:
    return f"<run>\n```python\n{code.rstrip()}\n```\n</run>"


def extract_code(text: str, fenced_only: bool = False) -> str | None:
    """The code in `text`: its last Python-fenced block that defines a function (else
    its last Python-fenced block; an unclosed fence runs to the end), or, unless
    fenced_only, the text itself when it defines a function. None when there is none."""
    blocks = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _PYTHON_LABELS]
    defining = [block for block in blocks if "def " in block]
    code = (defining or blocks or [None])[-1]
    if code is None and not fenced_only and "def " in text:
        code = text
    code = code.strip("\n").rstrip() if code is not None else None
    return code or None


@dataclass
class Action:
    """What one action asks for: `run` or `answer` some code, or an error to report."""

    kind: str | None
    code: str | None = None
    error: str | None = None


def _masked(text: str) -> str:
    """`text` with its fenced blocks and `<think>` blocks blanked out (same length), so
    a tag the code prints or the thinking mentions is not read as the action."""
    for pattern in (_FENCE, _THINK):
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    return text


def parse_action(text: str, multi_turn: bool) -> Action:
    """The first `<run>`/`<answer>` tag outside code and thinking is the action (its
    close tag may be missing: generation stops there); a bare ```python block is an
    answer. In single-turn mode every action answers."""
    masked = _masked(text)
    tags = list(_TAG.finditer(masked))
    if not tags:
        code = extract_code(text, fenced_only=True)
        if code is not None:
            return Action("answer", code)
        how = f"<run>\n{FENCE_EXAMPLE}\n</run> or " if multi_turn else ""
        return Action(None, error=f"no code found; write {how}<answer>\n{FENCE_EXAMPLE}\n</answer>")
    first = tags[0]
    tag = first.group(1)
    close = masked.find(f"</{tag}>", first.end())
    code = extract_code(text[first.end() : close if close != -1 else len(text)])
    kind = tag if multi_turn else "answer"
    if code is None:
        return Action(kind, error=f"no code in <{tag}>; write <{tag}>\n{FENCE_EXAMPLE}\n</{tag}>")
    return Action(kind, code)


@dataclass
class CodeOptions:
    """env.options of the code environment (see build_code)."""

    seed: int = 0
    n_train: int = 256
    n_eval: int = 64
    families: list = field(default_factory=list)
    kind_by: str = "family"
    n_tests: int = 8
    n_examples: int = 2
    multi_turn: bool = False
    max_turns: int = 3
    timeout_s: float = 5.0
    memory_mb: int = 256
    pool_size: int = 2
    max_obs_chars: int = 800

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> CodeOptions:
        """The options with defaults filled in; an unknown or out-of-range one fails here."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise ValueError(f"env.options for code: unknown {unknown}; valid: {', '.join(names)}")
        parsed = cls(**options)
        for name in ("n_train", "n_eval", "n_tests", "n_examples", "max_turns", "memory_mb", "pool_size",
                     "max_obs_chars"):  # fmt: skip
            value = getattr(parsed, name)
            least = 0 if name in ("n_train", "n_eval", "n_examples") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"env.options.{name} for code: want a whole number >= {least}, got {value!r}")
        timeout = parsed.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"env.options.timeout_s for code: want seconds > 0, got {parsed.timeout_s!r}")
        if not isinstance(parsed.multi_turn, bool):
            raise ValueError(f"env.options.multi_turn for code: want true or false, got {parsed.multi_turn!r}")
        return parsed

    def task_config(self) -> TaskConfig:
        return TaskConfig(self.seed, self.n_train, self.n_eval, tuple(self.families), self.n_tests, self.n_examples,
                          self.kind_by)  # fmt: skip

    def sandbox_settings(self) -> SandboxSettings:
        return SandboxSettings(float(self.timeout_s), self.memory_mb, self.pool_size)

    @property
    def runs_allowed(self) -> int:
        """`<run>`s an episode may make and still answer."""
        return self.max_turns - 1 if self.multi_turn else 0


def oracle_actions(task: Task, options: CodeOptions) -> list[str]:
    """The reference solver's turns: in multi-turn mode one `<run>` of the reference
    solution first (the tool in use), then the answer."""
    code = task.metadata["reference"]
    return ([run_action(code)] if options.runs_allowed > 0 else []) + [answer_action(code)]


@dataclass
class CodeEnv:
    """One episode; `step` returns (observation, done, info) with info["turn"] a Turn
    and, on an answer, info["reward"] the share of hidden tests passed."""

    sandbox: SharedSandbox
    options: CodeOptions

    def __post_init__(self) -> None:
        self.stop_strings = ["</run>", "</answer>"] if self.options.multi_turn else ["</answer>"]
        self.turn_index = 0
        self.task: Task | None = None

    def reset(self, task: Task) -> Opening:
        self.task, self.turn_index = task, 0
        if self.options.multi_turn:
            rules = MULTI_TURN.replace("{runs}", str(self.options.runs_allowed))
            return Opening([{"role": "system", "content": rules}, {"role": "user", "content": task.question}],
                           [RUN_TOOL])  # fmt: skip
        return Opening([{"role": "system", "content": SINGLE_TURN}, {"role": "user", "content": task.question}])

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError("CodeEnv.step before reset")
        parsed = parse_action(action, self.options.multi_turn)
        turn = Turn(self.turn_index, action, error=parsed.error)
        self.turn_index += 1
        last_turn = not self.options.multi_turn or self.turn_index >= self.options.max_turns
        if parsed.kind == "answer" and parsed.code is not None:
            return self._answer(turn, parsed.code)
        if last_turn:
            return None, True, {"turn": turn, "stop_reason": "max_turns" if parsed.error is None else "invalid"}
        observation = self._run(turn, parsed.code) if parsed.code is not None else f"error: {parsed.error}"
        turn.observation = self._output(observation)
        return turn.observation, False, {"turn": turn}

    def _answer(self, turn: Turn, code: str) -> tuple[None, bool, dict[str, Any]]:
        """Run the hidden tests; their pass share is this turn's reward."""
        task = self.task
        assert task is not None
        tests = task.metadata["tests"]
        report = run_tests(self.sandbox.get(), code, task.metadata["function"], tests, self.options.timeout_s)
        turn.answer = code
        return None, True, {"turn": turn, "reward": report.fraction, "stop_reason": "answer"}

    def _run(self, turn: Turn, code: str) -> str:
        """Run `code` on the question's examples; the rendered outcome for the model."""
        task = self.task
        assert task is not None
        function, examples = task.metadata["function"], task.metadata["tests"][: task.metadata["examples"]]
        report = run_tests(self.sandbox.get(), code, function, examples, self.options.timeout_s, report=True,
                           max_chars=self.options.max_obs_chars)  # fmt: skip
        text = render_report(report, function, examples)
        broken = report.failure is not None or report.load_error is not None
        raised = any("error" in record for record in report.results)
        turn.tool_calls = [ToolCall("run", {"code": code}, raw=turn.action)]
        turn.tool_results = [ToolResult(text, is_error=broken or raised, name="run", elapsed_s=report.elapsed_s)]
        return text

    def _output(self, text: str) -> str:
        limit = self.options.max_obs_chars
        text = text if len(text) <= limit else text[:limit] + CUT_MARK
        return f"\n<output>\n{text}\n</output>\n"


class CodeEnvFactory:
    """Fresh CodeEnvs around one shared sandbox pool."""

    def __init__(self, options: CodeOptions) -> None:
        self.options = options
        self.sandbox = SharedSandbox(options.sandbox_settings())

    def __call__(self) -> CodeEnv:
        return CodeEnv(self.sandbox, self.options)

    def close(self) -> None:
        self.sandbox.close()


@register_env("code")
def build_code(ctx: EnvContext) -> EnvSpec:
    """Write-a-Python-function tasks (ponder.envs.code_tasks) checked by hidden tests in the sandbox.

    env.options (all optional):
      seed / n_train / n_eval: task generator seed (0) and tasks per split (256 / 64);
        no problem statement is in both splits.
      families: problem families to draw (all of ponder.envs.code_tasks.FAMILIES).
      kind_by: the task kind is its `family` (default) or its `difficulty` (easy,
        medium, hard), so evaluations break results down by it.
      n_tests / n_examples: tests per task (8) and how many of them the question
        shows as examples (2); the rest stay hidden.
      multi_turn: offer `<run>` before the answer (false); max_turns: actions per
        episode in multi-turn mode (3: up to two runs, then the answer).
      timeout_s / memory_mb: limits of one sandbox run (5 s over all of a check's
        tests, 256 MB); pool_size: warm sandboxes (2).
      max_obs_chars: longest `<output>` shown after a run (800 characters).
    Reward components: tests_passed (1.0), all_pass (0.0, logged), format (0.1);
    change the weights with reward.terms."""
    options = CodeOptions.from_options(dict(ctx.options))
    train, evaluation = code_splits(options.task_config())
    for task in train + evaluation:
        task.oracle_actions = oracle_actions(task, options)
    factory = CodeEnvFactory(options)
    # Start the sandbox now: a machine that cannot jail code fails here, with the
    # sandbox's own message, rather than as an env_error in every episode.
    factory.sandbox.get()
    rewards = {"tests_passed": hidden_tests_passed, "all_pass": all_pass, "format": code_format}
    return EnvSpec(factory, train, evaluation, rewards, dict(REWARD_WEIGHTS))
