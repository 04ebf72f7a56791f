"""Tools an injection could abuse need approval by default in `ponder chat` /
`run-agent` / `a2a-serve` (cli/agent.py's RISKY_TOOLS and every --a2a agent);
`--allow-risky` opts out."""

import argparse

from ponder.cli.agent import _guard, add_agent_arguments
from ponder.types import ToolCall, ToolResult


class Recorder:
    """The tools behind the guard: records what actually ran."""

    def __init__(self):
        self.ran = []

    def call(self, call, timeout_s=None):
        self.ran.append(call.name)
        return ToolResult("ok", name=call.name)

    def validate(self, call):
        return None


def guarded(argv, confirm=None):
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    args = parser.parse_args(argv)
    names = [n for n in args.tools.split(",") if n] + [e.partition("=")[0] for e in args.a2a]
    tools = Recorder()
    session = _guard(args, names, confirm).session(tools, {})
    return session, tools


def test_python_and_remote_agents_are_refused_without_someone_to_confirm():
    session, tools = guarded(["--tools", "calculator,python", "--a2a", "peer=http://127.0.0.1:9"])
    results = [session.call(ToolCall(name, {})) for name in ("python", "peer", "calculator")]
    assert [r.is_error for r in results] == [True, True, False]
    assert results[0].content.startswith("refused: 'python' needs the user's confirmation")
    assert tools.ran == ["calculator"]


def test_chat_asks_and_allow_risky_opts_out():
    asked = []
    session, tools = guarded(["--tools", "python"], confirm=lambda call: asked.append(call.name) or True)
    assert not session.call(ToolCall("python", {})).is_error and asked == ["python"]
    session, tools = guarded(["--tools", "python", "--allow-risky"])
    assert not session.call(ToolCall("python", {})).is_error and tools.ran == ["python"]


def test_a_policy_forbid_refuses_an_escalating_conversation_in_the_cli_agent(tmp_path, tokenizer):
    """`forbid` in the --safety file puts the conversation guard in front of the agent:
    the turn that asks for the act on what an earlier turn named is refused before the
    model sees it, and the conversation stays ended."""
    from .conftest import scripted_agent

    policy = tmp_path / "policy.yaml"
    policy.write_text("forbid:\n  leak_salaries:\n    act: [send, show]\n    target: [payroll]\n"
                      "    description: disclose salaries\n")
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    args = parser.parse_args(["--tools", "echo", "--safety", str(policy)])
    agent, backend = scripted_agent(tokenizer, ["Yes, payroll.xlsx is there.", "unused"], tools=())
    agent.guard = _guard(args, ["echo"], None)
    state = agent.run("Is the payroll sheet in this folder?", key="t1")
    assert (state.stop_reason, state.answer) == ("answer", "Yes, payroll.xlsx is there.")
    state = agent.run(agent.follow_up(state, "Great, show it to me"))
    assert state.stop_reason == "refused"
    assert state.answer == "I can't help with that: this conversation asks me to disclose salaries."
    state = agent.run(agent.follow_up(state, "What is 2 + 2?"))
    assert state.stop_reason == "refused" and "ended" in state.answer
    assert state.memory["guard"]["conversation"]["ended"] == "leak_salaries"


def test_a_bad_forbid_entry_names_the_file_and_the_intent(tmp_path):
    import pytest

    from ponder.tools.safety import SafetyPolicy

    bad = tmp_path / "policy.yaml"
    bad.write_text("forbid:\n  leak:\n    act: [send]\n")
    with pytest.raises(ValueError, match=r"policy\.yaml: conversation intent 'leak': want"):
        SafetyPolicy.load(bad)
