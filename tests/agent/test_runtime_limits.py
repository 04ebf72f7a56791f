"""Issue 21, item 6 on the Agent path: what ended runs with internal_error (a tool's lone
surrogate, a 5000-deep JSON call, non-UTF-8 `--task` bytes) and what ran unbounded (50
calls in one action) now end as ordinary turns."""

import json

from ponder.agent.state import ANSWERED
from ponder.cli import main
from ponder.tools import tool

from .conftest import call, scripted_agent
from .openai_server import running


@tool
def garbled(query: str) -> str:
    """Returns text no UTF-8 encoder accepts.

    Args:
        query: Ignored.
    """
    return f"about {query}: \ud800 and a NUL \x00 here"


def test_a_tool_returning_a_lone_surrogate_is_an_ordinary_turn(tokenizer, tmp_path):
    agent, _ = scripted_agent(tokenizer, [call("garbled", query="owls"), "Owls hoot."], tools=[garbled])
    state = agent.run("q", key="t1")
    assert (state.status, state.answer) == (ANSWERED, "Owls hoot.")
    assert "about owls: \ufffd and a NUL  here" in state.messages[3]["content"]
    state.save(tmp_path / "state.json")  # UTF-8 JSON: would raise on a surrogate
    assert json.loads((tmp_path / "state.json").read_text(encoding="utf-8"))["answer"] == "Owls hoot."


def test_a_5000_deep_json_call_is_a_parse_error_the_model_can_correct(tokenizer):
    deep = "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>"
    agent, _ = scripted_agent(tokenizer, [deep, "Sorry."], max_new_tokens_per_turn=20000, max_generated_tokens=40000,
                              max_context_tokens=100000)  # fmt: skip
    state = agent.run("q", key="t1")
    assert (state.status, state.answer) == (ANSWERED, "Sorry.")
    assert state.turns[0].error.startswith("invalid JSON in <tool_call>: nested too deeply")


def test_fifty_calls_in_one_action_run_eight(tokenizer):
    ran = []

    @tool
    def note(i: int) -> str:
        """Record a number.

        Args:
            i: The number.
        """
        ran.append(i)
        return "ok"

    action = "".join(call("note", i=i) for i in range(50))
    agent, _ = scripted_agent(tokenizer, [action, "done"], tools=[note], max_new_tokens_per_turn=4000,
                              max_generated_tokens=8000, max_context_tokens=100000)  # fmt: skip
    state = agent.run("q", key="t1")
    assert state.status == ANSWERED and ran == list(range(8))
    assert sum(r.is_error for r in state.turns[0].tool_results) == 42


def test_run_agent_with_non_utf8_task_bytes_replaces_them(capsys):
    # What Python makes of `--task $'hi \xff there'`: the byte as a lone surrogate.
    with running([{"content": "hello"}]) as (url, requests):
        code = main(["run-agent", "--task", "hi \udcff there", "--model", url, "--no-transcript"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["answer"] == "hello"
    assert requests[0]["messages"][-1]["content"] == "hi \ufffd there"
