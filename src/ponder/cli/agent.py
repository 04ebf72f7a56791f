"""`ponder chat` (interactive, streaming) and `ponder run-agent` (one task, JSON out).

`register(commands)` adds both to the `ponder` argument parser; `ponder.cli` calls it.
Bad input (unknown tool, missing file, invalid config or schema file) raises
ValueError / OSError, which `ponder.cli.main` prints as one line with exit code 2.

Both run their tools behind a guard (ponder.tools.safety): tool output that reads as an
injection is marked, and a tool named in `--sensitive` (or sensitive in `--safety`'s
policy) runs only when the user approves it: `chat` asks y/N at the prompt; `run-agent`,
with no one to ask, refuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

CHAT_HELP = "commands: /tools, /reset, /save FILE, /load FILE, /help, /quit"
CHAT_COMMANDS = """\
/tools       list the agent's tools
/reset       start a new conversation
/save FILE   save the conversation as JSON
/load FILE   continue a saved conversation (or a `run-agent --save-state` file)
/help        show this list
/quit        leave (also /exit, Ctrl-D, or Ctrl-C at the prompt)
Ctrl-C while the agent replies stops that reply; the conversation is kept.
"""


def _add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m",
                        help="smollm2-135m (embedded), tiny, a local HF model dir, or an OpenAI-compatible base URL")
    parser.add_argument("--api-model", help="model name sent to an HTTP endpoint")
    parser.add_argument("--tools", default="calculator,echo",
                        help="comma-separated built-in tools: calculator,echo,python,read_file,search,rag")
    parser.add_argument("--files-root", help="folder the read_file tool may read")
    parser.add_argument("--corpus", help="JSONL corpus for the search tool")
    parser.add_argument("--docs", action="append", help="document file or folder for the rag tool (repeatable)")
    parser.add_argument("--sensitive", default="",
                        help="comma-separated tools that need the user's approval for every call (chat asks y/N)")
    parser.add_argument("--safety", help="YAML/JSON safety policy: allow, sensitive, trusted, argument rules "
                                         "(see ponder.tools.safety.policy)")
    parser.add_argument("--config", help="YAML file of AgentConfig fields (see ponder.agent.config)")
    parser.add_argument("--schema", help="JSON Schema file the final answer must match")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="AgentConfig overrides, e.g. max_turns=4")


def register(commands: Any) -> None:
    """Add `chat` and `run-agent` to the `ponder` sub-command parsers."""
    chat = commands.add_parser("chat", help="interactive chat with an agent and its tools (streams tokens)")
    _add_agent_arguments(chat)
    chat.set_defaults(handler=cmd_chat)

    run = commands.add_parser("run-agent", help="run an agent on one task and print the result as JSON")
    task = run.add_mutually_exclusive_group(required=True)
    task.add_argument("--task", help="the task text")
    task.add_argument("--resume", metavar="STATE_JSON", help="continue a saved agent state")
    _add_agent_arguments(run)
    run.add_argument("--max-steps", type=int, help="stop after this many steps (the state can be resumed)")
    run.add_argument("--save-state", metavar="FILE", help="write the final agent state as JSON")
    run.add_argument("--out", help="write the JSON result here as well as to stdout")
    run.add_argument("--no-transcript", action="store_true", help="leave the transcript out of the JSON")
    run.set_defaults(handler=cmd_run_agent)


def build_agent(args: argparse.Namespace, on_event: Callable[[str, Any], None] | None = None,
                confirm: Callable[[Any], bool] | None = None) -> Any:
    """The Agent the arguments describe; every input is checked before the model loads.
    `confirm(call) -> bool` approves sensitive calls (None: they are refused)."""
    from ponder.agent import Agent, AgentConfig, load_chat_policy
    from ponder.agent.toolbox import ToolboxOptions, build_tools
    from ponder.config import load_recipe

    config = load_recipe(args.config, args.overrides, cls=AgentConfig)
    if args.schema:
        config.answer_schema = _read_json(args.schema)
    names = [name.strip() for name in args.tools.split(",") if name.strip()]
    tools = build_tools(names, ToolboxOptions(files_root=args.files_root, corpus=args.corpus, docs=args.docs))
    guard = _guard(args, [getattr(t, "name", "") for t in tools], confirm)
    policy = load_chat_policy(args.model, temperature=args.temperature, seed=args.seed, api_model=args.api_model)
    return Agent(policy, tools, config, on_event=on_event, guard=guard)


def _guard(args: argparse.Namespace, tool_names: list[str], confirm: Callable[[Any], bool] | None) -> Any:
    """The CLI's guard: the --safety policy plus --sensitive tools; flagged output is
    marked, not cut (a person reads along); the monitor and the information-flow rule on."""
    from ponder.tools.safety import Guard, GuardOptions, InjectionDetector, SafetyPolicy, ToolRule, TrajectoryMonitor

    policy = SafetyPolicy.load(args.safety) if getattr(args, "safety", None) else SafetyPolicy()
    for name in (n.strip() for n in (getattr(args, "sensitive", "") or "").split(",")):
        if name:
            policy.tools.setdefault(name, ToolRule()).sensitive = True
    detector = InjectionDetector(tool_names=tool_names)
    monitor = TrajectoryMonitor(policy.is_sensitive, detector)
    return Guard(policy, detector, confirm, monitor, GuardOptions(detector_action="flag"))


def confirm_at_prompt(read_line: Callable[[str], str], out: TextIO) -> Callable[[Any], bool]:
    """A confirmer that asks the person at the chat prompt: only `y` or `yes` approves;
    anything else, end of input or Ctrl-C declines."""

    def confirm(call: Any) -> bool:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        out.write(f"\n  allow {call.name}({arguments[:300]})? [y/N] ")
        out.flush()
        try:
            answer = read_line("")
        except (EOFError, KeyboardInterrupt):
            answer = ""
        return answer.strip().lower() in ("y", "yes")

    return confirm


def argument_text(text: str) -> str:
    """A command-line argument as the user typed it. Bytes that are not UTF-8 reach Python
    as lone surrogates (surrogateescape), which tokenizers and JSON output refuse: each
    such byte becomes U+FFFD, the Unicode replacement character."""
    from ponder.tools.limits import encodable

    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate no OS decoding makes (passed in from Python)
        return encodable(text)


def _read_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err


def cmd_run_agent(args: argparse.Namespace) -> int:
    from ponder.agent import AgentState
    from ponder.agent.rag import provenance
    from ponder.fileio import write_text_atomic

    agent = build_agent(args)
    task: Any = AgentState.load(args.resume) if args.resume else argument_text(args.task)
    state = agent.run(task, max_steps=args.max_steps)
    if args.save_state:
        state.save(args.save_state)
    result = state.result()
    record = state.memory.get("guard") or {}
    if record.get("refused") or record.get("confirmations"):
        result["safety"] = {key: record.get(key, []) for key in ("tainted_by", "refused", "confirmations")}
    cited = provenance(state)
    if cited:  # the passages the answer could be built on, with source and page/row
        result["provenance"] = cited
    if args.no_transcript:
        result.pop("transcript")
    text = json.dumps(result, ensure_ascii=False, indent=2, default=str)
    if args.out:
        write_text_atomic(args.out, text + "\n")
    print(text)
    return 0 if state.status == "answered" else 1


class ChatPrinter:
    """Shows a run as it happens: streamed text, then each tool result on its own line."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, kind: str, payload: Any) -> None:
        if kind == "text":
            self.out.write(payload)
        elif kind == "action":
            self.out.write("\n")
        elif kind == "tool_result":
            marker = "error" if payload.is_error else "ok"
            first = payload.content.strip().splitlines()[0] if payload.content.strip() else ""
            self.out.write(f"  [{payload.name} {marker}] {first[:200]}\n")
        elif kind == "correction":
            self.out.write(f"  [schema] {payload}\n")
        elif kind == "done" and payload.status != "answered":
            self.out.write(f"  [{payload.status}: {payload.stop_reason}{': ' + payload.error if payload.error else ''}]\n")
        self.out.flush()


def cmd_chat(args: argparse.Namespace) -> int:
    printer = ChatPrinter(sys.stdout)
    read_line = input if sys.stdin.isatty() else stream_reader(sys.stdin)
    agent = build_agent(args, on_event=printer, confirm=confirm_at_prompt(read_line, sys.stdout))
    if sys.stdin.isatty():
        save_history = enable_line_editing(history_path())
        try:
            return chat_loop(agent, read_line, sys.stdout)
        finally:
            save_history()
    return chat_loop(agent, read_line, sys.stdout)


def history_path() -> Path:
    """Where chat history lives: $XDG_CACHE_HOME/ponder/chat_history (~/.cache by default)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ponder" / "chat_history"


def enable_line_editing(path: Path | None) -> Callable[[], None]:
    """Arrow keys, editing and history for `input()` through the standard `readline`
    module, which is missing on some builds (Windows, some minimal Pythons): then chat
    still works without editing. Returns a function that saves the history to `path`;
    history is a convenience, so an unreadable or unwritable file is silently skipped."""
    try:
        import readline
    except ImportError:
        return lambda: None
    readline.set_history_length(1000)
    if path is not None:
        try:
            readline.read_history_file(str(path))
        except OSError:  # no history yet, or not readable
            pass

    def save() -> None:
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(str(path))
        except OSError:
            pass

    return save


def stream_reader(source: TextIO) -> Callable[[str], str]:
    """`input()`'s contract over a stream (piped chat): a line without its newline, EOFError at the end."""

    def read(prompt: str) -> str:
        line = source.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    return read


def chat_loop(agent: Any, read_line: Callable[[str], str], out: TextIO, prompt: str = "> ") -> int:
    """Read messages and commands with `read_line(prompt)` (`input`, or `stream_reader`)
    until EOF, Ctrl-C at the prompt, or /quit. Ctrl-C during a reply stops that reply
    only: the conversation so far is kept and the next prompt follows."""
    from ponder.agent import StateError

    state = None
    out.write(f"ponder chat with {agent.policy.name}; {CHAT_HELP}\n")
    while True:
        try:
            line = read_line(prompt).strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return 0
        if not line:
            continue
        if line.startswith("/"):
            try:
                state, stop = _command(agent, state, line, out)
            except (StateError, OSError) as err:
                out.write(f"error: {str(err).splitlines()[0]}\n")
                continue
            if stop:
                return 0
            continue
        state = agent.start(line) if state is None else agent.follow_up(state, line)
        _reply(agent, state, out)


def _reply(agent: Any, state: Any, out: TextIO) -> None:
    """Run the agent until it answers or stops; Ctrl-C ends this reply, not the chat."""
    try:
        agent.run(state)
    except KeyboardInterrupt:
        out.write("\n")
        agent.interrupt(state)
    out.flush()


def _command(agent: Any, state: Any, line: str, out: TextIO) -> tuple[Any, bool]:
    from ponder.agent import AgentState

    name, _, argument = line.partition(" ")
    argument = argument.strip()
    if name in ("/quit", "/exit"):
        return state, True
    if name == "/tools":
        for spec in agent.registry.specs():
            out.write(f"{spec.name}: {spec.description}\n")
        if not len(agent.registry):
            out.write("(no tools)\n")
    elif name == "/reset":
        out.write("conversation cleared\n")
        return None, False
    elif name in ("/save", "/load") and not argument:
        out.write(f"usage: {name} FILE\n")
    elif name == "/save":
        if state is None:
            out.write("nothing to save yet\n")
        else:
            state.save(argument)
            out.write(f"saved {len(state.messages)} messages to {argument}\n")
    elif name == "/load":
        state = AgentState.load(argument)
        out.write(f"loaded {len(state.messages)} messages from {argument}\n")
        if not state.finished:
            _reply(agent, state, out)
    elif name == "/help":
        out.write(CHAT_COMMANDS)
    else:
        out.write(f"unknown command {name}; {CHAT_HELP}\n")
    return state, False
