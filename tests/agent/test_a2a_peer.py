"""Remote A2A agents as tools and team members (ponder.agent.a2a_peer), through the
a2a-sdk client, against real servers on 127.0.0.1: ponder's own, the independently
written calculator agent (another process), and misbehaving ones."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("a2a")

from ponder.agent import Agent, AgentConfig, BackendPolicy  # noqa: E402
from ponder.agent.a2a_peer import (  # noqa: E402
    A2APeer,
    A2APeerError,
    A2APeerSpec,
    RemoteAgent,
    a2a_tool,
    parse_peer,
)
from ponder.agent.multi import Coordinator, PeerChat, TeamConfig  # noqa: E402
from ponder.rollout.scripted import ScriptedBackend  # noqa: E402
from ponder.tools.builtin import calculator  # noqa: E402
from ponder.tools.limits import CUT_MARK  # noqa: E402
from ponder.types import ToolCall  # noqa: E402

from .a2a_servers import INJECTION, app_serving, calculator_process, fault_app, ponder_serving, rule_agent  # noqa: E402
from .conftest import call  # noqa: E402


@pytest.fixture(scope="module")
def calc_url():
    with calculator_process() as url:
        yield url


@pytest.fixture(scope="module")
def ponder_url():
    with ponder_serving(rule_agent(), name="ponder-rule") as url:
        yield url


def test_a_spec_is_checked_and_parsed_from_the_command_line():
    spec = parse_peer("calc=http://127.0.0.1:9100/.well-known/agent-card.json", timeout_s=5)
    assert (spec.name, spec.base_url, spec.timeout_s) == ("calc", "http://127.0.0.1:9100/", 5)
    for bad in ("calc", "bad name=http://x", "calc=ftp://x"):
        with pytest.raises(A2APeerError):
            parse_peer(bad)
    with pytest.raises(A2APeerError, match="timeouts must be > 0"):
        A2APeerSpec("calc", "http://x", timeout_s=0)


def test_the_independent_calculator_agent_as_a_tool(calc_url):
    tool = a2a_tool(A2APeerSpec("calc", calc_url))
    assert "calculator" in tool.spec.description and "arithmetic" in tool.spec.description
    assert tool.spec.parameters["required"] == ["message"]
    assert tool(message="What is 17 * 23?").content == "17 * 23 = 391"


def test_a_remote_ponder_agent_inside_a_local_agent_loop(ponder_url, tokenizer):
    # the local model calls the remote agent like any tool; its reply is escaped and marked as data
    turns = [call("remote", message="What is 6 * 7?"), "It is 42."]
    backend = ScriptedBackend(tokenizer, {"t1": turns})
    agent = Agent(BackendPolicy(backend), [a2a_tool(A2APeerSpec("remote", ponder_url))], AgentConfig())
    state = agent.run("Ask the remote agent what 6 * 7 is.", key="t1")
    assert (state.status, state.answer) == ("answered", "It is 42.")
    observation = state.turns[0].observation
    assert "[output of tool 'remote'; untrusted data]" in observation and "The answer is 42." in observation
    assert [(a.tool, a.ok) for a in state.trace] == [("remote", True)]


@pytest.mark.parametrize(("kind", "reason"), [
    ("hang", "no reply within 1 s"),
    ("trickle", "no reply within 1 s"),
    ("html", "JSON Decode Error"),
    ("not_rpc", "neither 'result' nor 'error'"),
    ("rpc_error", "it answered with an error: boom"),
    ("huge", "the reply is larger than 1000000 bytes"),
    ("huge_chunked", "the reply is larger than 1000000 bytes"),
    ("input_required", "asks for input-required, which a peer call cannot give: which city?"),
])  # fmt: skip
def test_a_misbehaving_peer_is_a_failed_call_with_one_line(kind, reason):
    with app_serving(fault_app(kind)) as url:
        peer = A2APeer(A2APeerSpec("faulty", url, timeout_s=1.0))
        started = time.monotonic()
        reply = peer.ask("What is 2 + 2?")
        took = time.monotonic() - started
    assert not reply.ok and reason in reply.error, reply.error
    assert "\n" not in reply.error and len(reply.error) < 400
    assert took < 5.0  # bounded by the call's own limit (and the best-effort cancel), not the peer


def test_a_failing_remote_tool_is_recorded_and_falls_back(tokenizer, calc_url):
    # the agent's ToolRunner treats remote tools like local ones: a recorded failure, then the declared fallback
    with app_serving(fault_app("hang")) as url:
        tools = [a2a_tool(A2APeerSpec("remote", url, timeout_s=0.5)), a2a_tool(A2APeerSpec("calc", calc_url))]
        turns = [call("remote", message="What is 2 + 2?"), "4"]
        config = AgentConfig(tools={"remote": {"fallbacks": ["calc"]}})
        agent = Agent(BackendPolicy(ScriptedBackend(tokenizer, {"t1": turns})), tools, config)
        state = agent.run("What is 2 + 2?", key="t1")
    assert state.status == "answered"
    assert [(a.tool, a.kind, a.ok) for a in state.trace] == [("remote", "call", False), ("calc", "fallback", True)]
    assert state.trace[0].error == "remote: no reply within 0.5 s"
    assert "[remote failed; result from fallback tool calc]\n2 + 2 = 4" in state.turns[0].observation


def test_long_replies_are_cut_and_huge_ones_refused():
    with app_serving(fault_app("long")) as url:
        reply = A2APeer(A2APeerSpec("long", url, max_reply_chars=1000)).ask("hi")
    assert reply.ok and reply.text == "z" * 1000 + CUT_MARK.format(n=49_000)
    with app_serving(fault_app("long")) as url:
        reply = A2APeer(A2APeerSpec("long", url, max_reply_bytes=10_000)).ask("hi")
    assert not reply.ok and reply.error == "the reply is larger than 10000 bytes"


def test_a_card_that_cannot_be_read():
    with app_serving(fault_app("bad_card")) as url:
        with pytest.raises(A2APeerError, match="could not read its agent card"):
            a2a_tool(A2APeerSpec("faulty", url))
        state = RemoteAgent(A2APeerSpec("faulty", url)).run("hi")
    assert (state.status, state.stop_reason) == ("error", "remote_failed")
    assert state.error.startswith("remote agent 'faulty': could not read its agent card")
    with pytest.raises(A2APeerError, match="could not read its agent card"):
        a2a_tool(A2APeerSpec("nobody", "http://127.0.0.1:9/", connect_timeout_s=2))


def test_a_remote_reply_that_reads_as_an_injection_is_marked():
    with app_serving(fault_app("injection")) as url:
        state = RemoteAgent(A2APeerSpec("faulty", url)).run("What is 2 + 2?")
    assert state.status == "answered"
    header, warning, body = state.answer.split("\n", 2)
    assert header == "[reply of remote agent 'faulty'; untrusted data]"
    assert warning.startswith("[warning: this reply reads as instructions to the assistant (override")
    assert body == INJECTION


def plan(*subtasks, answer=None):
    if answer is not None:
        return json.dumps({"answer": answer})
    return json.dumps({"subtasks": [{"role": r, "task": t} for r, t in subtasks]})


def scripted_planner(tokenizer, turns):
    return Agent(BackendPolicy(ScriptedBackend(tokenizer, {"planner": turns})), [], AgentConfig(max_corrections=1))


def test_a_coordinator_delegates_to_a_remote_ponder_agent_and_the_calculator(tokenizer, ponder_url, calc_url):
    planner = scripted_planner(tokenizer, [plan(("ponder", "What is 6 * 7?"), ("calc", "What is 17 * 23?")),
                                           plan(answer="42 and 391")])  # fmt: skip
    roles = {"ponder": RemoteAgent(A2APeerSpec("ponder", ponder_url)),
             "calc": RemoteAgent(A2APeerSpec("calc", calc_url))}
    result = Coordinator(planner, roles).run("Compute 6 * 7 and 17 * 23.")
    assert (result.status, result.answer) == ("answered", "42 and 391")
    replies = {m.sender: m.content for m in result.transcript if m.to == "planner"}
    assert replies["ponder"] == "[reply of remote agent 'ponder'; untrusted data]\nThe answer is 42."
    assert replies["calc"] == "[reply of remote agent 'calc'; untrusted data]\n17 * 23 = 391"
    calls = {r["agent"]: r["tool_attempts"][0] for r in result.runs if r["agent"] != "planner"}
    assert calls["ponder"]["tool"] == f"a2a:{ponder_url}" and calls["calc"]["ok"]


def test_a_coordinator_records_a_hanging_peer_and_uses_its_fallback(tokenizer, calc_url):
    local = Agent(BackendPolicy(ScriptedBackend(tokenizer, {"calc": ["391"]})), [], AgentConfig())
    with app_serving(fault_app("hang")) as url:
        planner = scripted_planner(tokenizer, [plan(("slow", "What is 17 * 23?"), ("calc", "What is 17 * 23?")),
                                               plan(answer="391")])  # fmt: skip
        roles = {"slow": RemoteAgent(A2APeerSpec("slow", url, timeout_s=0.5)),
                 "calc": RemoteAgent(A2APeerSpec("calc", url, timeout_s=0.5), fallback=local)}
        result = Coordinator(planner, roles).run("What is 17 * 23?")
    assert result.status == "answered"
    slow, calc = (r for r in result.runs if r["agent"] in ("slow", "calc"))
    assert (slow["status"], slow["stop_reason"]) == ("error", "timeout")
    assert slow["error"] == "remote agent 'slow': no reply within 0.5 s"
    assert [(a["tool"], a["ok"]) for a in calc["tool_attempts"]] == [(f"a2a:{url}", False)]
    assert calc["answer"] == "[remote agent 'calc' failed (no reply within 0.5 s); answer from the fallback agent]\n391"
    assert "(no answer: error, timeout: remote agent 'slow': no reply within 0.5 s)" in result.transcript[1].content


def test_a_team_shares_its_clock_with_remote_members(tokenizer):
    with app_serving(fault_app("hang")) as url:
        planner = scripted_planner(tokenizer, [plan(("slow", "wait"))])
        result = Coordinator(planner, {"slow": RemoteAgent(A2APeerSpec("slow", url))},
                             config=TeamConfig(max_rounds=1, wall_clock_s=1.5)).run("task")  # fmt: skip
    slow = next(r for r in result.runs if r["agent"] == "slow")
    assert slow["stop_reason"] == "timeout" and slow["elapsed_s"] < 3.0


def test_a_peer_chat_with_a_remote_member(tokenizer, calc_url):
    local = Agent(BackendPolicy(ScriptedBackend(tokenizer, {"alice": ["@calc What is 12 * 12?", "FINAL: 144"]})), [],
                  AgentConfig())  # fmt: skip
    chat = PeerChat({"alice": local, "calc": RemoteAgent(A2APeerSpec("calc", calc_url))}, TeamConfig(max_rounds=2))
    result = chat.run("What is 12 * 12?")
    assert (result.status, result.answer) == ("answered", "144")
    assert result.transcript[1].sender == "calc" and result.transcript[1].content.endswith("12 * 12 = 144")


def test_the_command_line_adds_remote_agents_as_tools(calc_url, capsys):
    from ponder.cli import main, parse_args
    from ponder.cli.agent import build_agent

    agent = build_agent(parse_args(["run-agent", "--task", "x", "--model", "tiny", "--tools", "echo",
                                    "--a2a", f"calc={calc_url}"]))  # fmt: skip
    assert agent.registry.names() == ["echo", "calc"]
    assert agent.registry.call(ToolCall("calc", {"message": "What is 9 * 9?"})).content == "9 * 9 = 81"
    for entry, said in (("calc", "want NAME=URL"), ("calc=http://127.0.0.1:9/", "could not read its agent card")):
        assert main(["run-agent", "--task", "x", "--model", "tiny", "--a2a", entry]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("ponder run-agent: error: ") and said in line
