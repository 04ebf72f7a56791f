"""`ponder chat`'s loop: commands, Ctrl-C during a reply and at the prompt, line editing."""

import io

import pytest

from ponder.agent import Agent, BackendPolicy
from ponder.agent.console import CHAT_COMMANDS, ChatPrinter, chat_loop, enable_line_editing, stream_reader
from ponder.rollout.scripted import ScriptedBackend

from .conftest import add, call

INTERRUPT = object()  # in a script: the user presses Ctrl-C while this reply streams


class InterruptiblePolicy(BackendPolicy):
    """A scripted model whose replies may be cut short by Ctrl-C: at an INTERRUPT entry it
    streams a few words and then raises KeyboardInterrupt, as the terminal would."""

    def __init__(self, tokenizer, replies):
        self.replies = list(replies)
        self.seen = []  # the messages each call was given
        scripted = [r for r in self.replies if r is not INTERRUPT]
        super().__init__(ScriptedBackend(tokenizer, {"chat": scripted}), name="scripted")

    def complete(self, messages, stop, max_new_tokens, key, on_text=None, timeout_s=None):
        self.seen.append([dict(m) for m in messages])
        if self.replies.pop(0) is INTERRUPT:
            on_text("Once upon")
            raise KeyboardInterrupt
        return super().complete(messages, stop, max_new_tokens, "chat", on_text, timeout_s)


def lines(*typed):
    """`input()` over typed lines; after the last one, EOF (Ctrl-D)."""
    return stream_reader(io.StringIO("".join(line + "\n" for line in typed)))


def chat(tokenizer, replies, reader):
    out = io.StringIO()
    policy = InterruptiblePolicy(tokenizer, replies)
    agent = Agent(policy, [add], on_event=ChatPrinter(out))
    return chat_loop(agent, reader, out), out.getvalue(), policy


def test_help_lists_every_command(tokenizer):
    code, out, _ = chat(tokenizer, [], lines("/help"))
    assert code == 0
    assert out.endswith(CHAT_COMMANDS + "\n")  # the closing newline is the EOF's
    listed = [row.split()[0] for row in CHAT_COMMANDS.splitlines() if row.startswith("/")]
    assert listed == ["/tools", "/reset", "/save", "/load", "/help", "/quit"]
    assert "unknown command" not in out


def test_ctrl_c_during_a_reply_keeps_the_conversation_and_the_chat_goes_on(tokenizer):
    replies = [call("add", a=2, b=3), "It is 5.", INTERRUPT, "Doubled: 10."]
    typed = lines("What is 2+3?", "Tell me a long story", "And doubled?")
    code, out, policy = chat(tokenizer, replies, typed)
    assert code == 0
    assert "It is 5.\n" in out
    assert "Once upon\n  [stopped: interrupted]\n" in out
    assert out.endswith("Doubled: 10.\n\n")
    # The reply after the interruption saw the whole conversation before it, unchanged.
    last = policy.seen[-1]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user", "user"]
    assert [m["content"] for m in last[1:]] == [
        "What is 2+3?", call("add", a=2, b=3), "<tool_response>\n[output of tool 'add'; untrusted data]\n5\n</tool_response>",
        "It is 5.",
        "Tell me a long story", "And doubled?",
    ]
    assert policy.seen[2] == last[:-1]  # the interrupted call had the same history


def test_ctrl_c_at_the_prompt_leaves_cleanly(tokenizer):
    typed = iter(["What is 2+3?"])

    def read_line(prompt):
        assert prompt == "> "
        for line in typed:
            return line
        raise KeyboardInterrupt

    code, out, policy = chat(tokenizer, ["5"], read_line)
    assert code == 0 and out.endswith("5\n\n") and len(policy.seen) == 1


def test_history_is_kept_and_an_unwritable_history_file_is_ignored(tmp_path):
    readline = pytest.importorskip("readline")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    # The history's folder is a file: nothing is written and nothing raised.
    enable_line_editing(blocked / "chat_history")()
    assert blocked.read_text() == ""
    history = tmp_path / "cache" / "ponder" / "chat_history"
    save = enable_line_editing(history)
    readline.add_history("what is 2+3?")
    save()
    assert "what is 2+3?" in history.read_text().splitlines()
