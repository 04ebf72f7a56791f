"""The terminal chat runtime behind `ponder chat`: a read-reply loop over an agent,
its slash commands, streamed output, a y/N confirmer for sensitive tools, and line
editing with history."""

from __future__ import annotations

import json
import os
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
