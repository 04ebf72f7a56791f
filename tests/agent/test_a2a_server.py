"""`ponder a2a-serve` (ponder.agent.a2a_server) driven by the a2a-sdk's own client and by
raw JSON-RPC: the card, send, stream, get, cancel, an unknown task id, malformed messages.
One server is the real command with the tiny model (a process); one is the same app
in-process with a rule-based fake model, for answers and cancellation that must be exact."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx
import pytest

pytest.importorskip("a2a")

from a2a.client import A2ACardResolver, ClientConfig, create_client  # noqa: E402
from a2a.helpers import get_message_text, new_data_part, new_message, new_text_message  # noqa: E402
from a2a.types import (  # noqa: E402
    CancelTaskRequest,
    GetTaskRequest,
    InvalidParamsError,
    Role,
    SendMessageRequest,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskState,
)

from ponder.agent.a2a_peer import A2APeerSpec, RemoteAgent  # noqa: E402
from ponder.agent.multi import Coordinator  # noqa: E402
from ponder.tools.builtin import calculator, echo  # noqa: E402

from .a2a_servers import calculator_process, ponder_serving, process_serving, rule_agent  # noqa: E402
from .test_a2a_peer import plan, scripted_planner  # noqa: E402

TINY = [sys.executable, "-m", "ponder.cli", "a2a-serve", "--model", "tiny", "--tools", "calculator,echo",
        "--port", "0", "--name", "tiny-agent", "max_turns=1", "max_new_tokens_per_turn=8"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_url():
    with process_serving(TINY) as url:
        yield url


@pytest.fixture(scope="module")
def rule_url():
    with ponder_serving(rule_agent(max_turns=4), name="rule-agent", max_message_chars=500) as url:
        yield url


def run(coroutine):
    return asyncio.run(coroutine)


def user(text: str):
    return SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))


async def send(url: str, text: str, streaming: bool = False, polling: bool = False) -> list:
    async with await create_client(url, ClientConfig(streaming=streaming, polling=polling)) as client:
        return [event async for event in client.send_message(user(text))]


async def client_call(url: str, method: str, request):
    async with await create_client(url, ClientConfig(streaming=False)) as client:
        return await getattr(client, method)(request)


def step_kind(event) -> str:
    """What a streamed status update reports: "action", "tool_result", or "" (a state change)."""
    metadata = event.status_update.status.message.metadata
    return metadata["ponder_event"] if "ponder_event" in metadata else ""


def raw(url: str, body, version: str | None = None) -> dict:
    headers = {"A2A-Version": version} if version else {}
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(url, content=content, headers={"Content-Type": "application/json", **headers}).json()


def test_the_card_of_the_tiny_agent(tiny_url):
    async def read():
        async with httpx.AsyncClient() as http:
            card = await A2ACardResolver(http, tiny_url).get_agent_card()
            served = (await http.get(tiny_url + ".well-known/agent-card.json")).json()
        return card, served

    card, served = run(read())
    assert card.name == "tiny-agent"
    assert "model tiny" in card.description and "calculator, echo" in card.description
    assert [(s.id, s.description) for s in card.skills] == [(calculator.name, calculator.spec.description),
                                                            (echo.name, echo.spec.description)]  # fmt: skip
    assert card.capabilities.streaming and not card.capabilities.push_notifications
    assert {(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces} == {
        (tiny_url, "JSONRPC", "1.0"), (tiny_url, "JSONRPC", "0.3")}
    assert served["url"] == tiny_url and served["preferredTransport"] == "JSONRPC"  # the 0.3 card fields too
    assert list(card.default_input_modes) == ["text/plain"]


def test_send_get_and_stream_with_the_tiny_model(tiny_url):
    (event,) = run(send(tiny_url, "What is 17 * 23?"))
    task = event.task
    # the random tiny model never writes an answer: the run stops at max_turns and the task fails, saying why
    assert task.status.state in (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED)
    if task.status.state == TaskState.TASK_STATE_FAILED:
        assert get_message_text(task.status.message).startswith("no answer: stopped (")
    assert get_message_text(task.history[0]) == "What is 17 * 23?"
    fetched = run(client_call(tiny_url, "get_task", GetTaskRequest(id=task.id)))
    assert (fetched.id, fetched.status.state) == (task.id, task.status.state)

    events = run(send(tiny_url, "Say hello.", streaming=True))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert kinds[1] == "status_update" and events[1].status_update.status.state == TaskState.TASK_STATE_WORKING
    final = events[-1].status_update.status
    assert final.state in (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED)
    actions = [e for e in events[2:-1] if step_kind(e) == "action"]
    assert len(actions) == 1  # max_turns=1: the one model action, streamed before the end


def test_an_answer_comes_back_as_an_artifact_and_streams_its_steps(rule_url):
    (event,) = run(send(rule_url, "What is 17 * 23?"))
    task = event.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    (artifact,) = task.artifacts
    assert (artifact.name, get_message_text(artifact)) == ("answer", "The answer is 391.")
    assert artifact.metadata["stop_reason"] == "answer" and artifact.metadata["tool_calls"] == 1

    events = run(send(rule_url, "What is 6 * 7?", streaming=True))
    steps = [(step_kind(e), get_message_text(e.status_update.status.message))
             for e in events if e.WhichOneof("payload") == "status_update" and step_kind(e)]
    assert [kind for kind, _ in steps] == ["action", "tool_result", "action"]
    assert '"calculator"' in steps[0][1] and steps[1][1] == "result of calculator: 42"
    assert steps[2][1] == "The answer is 42."
    artifact_update = next(e.artifact_update for e in events if e.WhichOneof("payload") == "artifact_update")
    assert get_message_text(artifact_update.artifact) == "The answer is 42."
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_cancel_a_running_task(rule_url):
    (event,) = run(send(rule_url, "slow: take a nap", polling=True))  # return_immediately: the task is running
    task_id = event.task.id

    async def cancel_then_look():
        async with await create_client(rule_url, ClientConfig(streaming=False)) as client:
            await asyncio.sleep(0.3)
            cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
            fetched = await client.get_task(GetTaskRequest(id=task_id))
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=task_id))
            return cancelled, fetched

    cancelled, fetched = run(cancel_then_look())
    assert cancelled.status.state == fetched.status.state == TaskState.TASK_STATE_CANCELED
    assert get_message_text(fetched.status.message) == "cancelled by the client"
    started = time.monotonic()
    (after,) = run(send(rule_url, "What is 2 + 3?"))  # answered once the cancelled run's nap has ended
    assert after.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert time.monotonic() - started > 1.0  # not beside it: one run at a time on the one model


def test_an_unknown_task_id(rule_url):
    for method, request in (("get_task", GetTaskRequest(id="no-such-task")),
                            ("cancel_task", CancelTaskRequest(id="no-such-task"))):  # fmt: skip
        with pytest.raises(TaskNotFoundError):
            run(client_call(rule_url, method, request))
    for body, version in (({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "nope"}}, None),
                          ({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "nope"}}, "1.0"),
                          ({"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": {"id": "nope"}}, None)):
        reply = raw(rule_url, body, version)
        assert (reply["id"], reply["error"]["code"]) == (body["id"], -32001), reply


def test_malformed_messages_are_protocol_errors(rule_url):
    for message in (new_text_message("   ", role=Role.ROLE_USER),
                    new_message([new_data_part({"x": 1})], role=Role.ROLE_USER),
                    new_text_message("What is 1 + 1? " * 100, role=Role.ROLE_USER)):  # fmt: skip
        for streaming in (False, True):
            async def go():
                async with await create_client(rule_url, ClientConfig(streaming=streaming)) as client:
                    return [e async for e in client.send_message(SendMessageRequest(message=message))]

            with pytest.raises(InvalidParamsError):
                run(go())
    def rpc(number, method, params, jsonrpc="2.0"):
        return {"jsonrpc": jsonrpc, "id": number, "method": method, "params": params}

    cases = [
        (rpc(1, "SendMessage", {"message": "hello"}), "1.0", -32602),  # not a Message
        (rpc(2, "SendMessage", {"message": {"role": "ROLE_USER"}}), "1.0", -32602),  # no parts, no id
        (rpc(3, "message/send", {"message": {"role": "user"}}), None, -32600),  # the same in 0.3
        (rpc(4, "message/fly", {}), None, -32601),
        (rpc(5, "message/send", {}, jsonrpc="1.0"), None, -32600),
        ("{not json", None, -32700),
    ]
    for body, version, code in cases:
        assert raw(rule_url, body, version)["error"]["code"] == code, body


def test_the_v0_3_method_names(rule_url):
    parts = [{"kind": "text", "text": "What is 5 * 5?"}]
    message = {"role": "user", "messageId": "m1", "kind": "message", "parts": parts}
    reply = raw(rule_url, {"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": {"message": message}})
    result = reply["result"]
    assert (result["kind"], result["status"]["state"]) == ("task", "completed")
    assert result["artifacts"][0]["parts"][0]["text"] == "The answer is 25."
    got = raw(rule_url, {"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"id": result["id"]}})
    assert got["result"]["status"]["state"] == "completed"
    params = {"message": {**message, "messageId": "m2"}}
    body = {"jsonrpc": "2.0", "id": 9, "method": "message/stream", "params": params}
    with httpx.stream("POST", rule_url, json=body, headers={"Accept": "text/event-stream"}) as response:
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    assert events[0]["result"]["kind"] == "task" and events[-1]["result"]["status"]["state"] == "completed"


def test_a_coordinator_delegates_to_the_served_tiny_agent_and_the_calculator(tiny_url, tokenizer):
    # across three processes on 127.0.0.1: this one plans, `ponder a2a-serve --model tiny` and the
    # independently written calculator agent answer; each call is recorded with its outcome
    with calculator_process() as calc_url:
        planner = scripted_planner(tokenizer, [plan(("tiny", "Say hello."), ("calc", "What is 17 * 23?")),
                                               plan(answer="17 * 23 = 391")])  # fmt: skip
        roles = {"tiny": RemoteAgent(A2APeerSpec("tiny", tiny_url)), "calc": RemoteAgent(A2APeerSpec("calc", calc_url))}
        result = Coordinator(planner, roles).run("Greet me, then compute 17 * 23.")
    assert (result.status, result.answer) == ("answered", "17 * 23 = 391")
    assert [(m.sender, m.to) for m in result.transcript] == [
        ("planner", "tiny"), ("tiny", "planner"), ("planner", "calc"), ("calc", "planner"), ("planner", "user")]
    assert result.transcript[3].content == "[reply of remote agent 'calc'; untrusted data]\n17 * 23 = 391"
    tiny = next(r for r in result.runs if r["agent"] == "tiny")
    assert tiny["tool_attempts"][0]["tool"] == f"a2a:{tiny_url}"
    if tiny["status"] != "answered":  # the tiny model's failed task, recorded with its one-line reason
        assert tiny["error"] == "remote agent 'tiny': the remote task ended failed: no answer: stopped (max_turns)"
