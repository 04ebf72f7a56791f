from ponder.agent import Agent, AgentConfig, load_chat_policy
from ponder.agent.openai_http import OpenAIPolicy
from ponder.agent.state import ANSWERED, ERROR

from .conftest import add, call
from .openai_server import closed_port_url, running


def test_agent_over_an_http_endpoint_with_text_tool_calls(tokenizer):
    with running([{"content": call("add", a=20, b=22)}, {"content": "The answer is 42."}]) as (url, requests):
        policy = load_chat_policy(url, api_model="scripted")
        state = Agent(policy, [add]).run("What is 20 + 22?")
    assert (state.status, state.answer) == (ANSWERED, "The answer is 42.")
    assert state.messages[3]["content"] == "<tool_response>\n[output of tool 'add'; untrusted data]\n42\n</tool_response>"
    assert requests[0]["model"] == "scripted" and requests[0]["stream"] is False
    assert [m["role"] for m in requests[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert state.counters.generated_tokens == 14  # the endpoint's usage, 7 per reply


def test_native_tool_calls_are_rewritten_for_the_shared_parser():
    with running([{"tool_calls": [("add", {"a": 1, "b": 2})]}, {"content": "3"}]) as (url, _):
        state = Agent(OpenAIPolicy(url), [add]).run("1 + 2?")
    assert state.turns[0].tool_calls[0].name == "add"
    assert state.turns[0].tool_calls[0].arguments == {"a": 1, "b": 2}
    assert state.answer == "3"


def test_streaming_delivers_text_in_pieces_and_joins_tool_call_fragments():
    pieces = []
    replies = [{"content": "Let me add.", "tool_calls": [("add", {"a": 5, "b": 6})]}, {"content": "It is eleven."}]
    with running(replies) as (url, requests):
        agent = Agent(OpenAIPolicy(url), [add], on_event=lambda kind, text: pieces.append(text) if kind == "text" else None)
        state = agent.run("5 + 6?")
    assert requests[0]["stream"] is True
    assert pieces[:4] == ["Let", " me", " ad", "d."] and "".join(pieces[-5:]) == "It is eleven."
    assert state.turns[0].tool_results[0].content == "11"
    assert state.answer == "It is eleven."


def test_server_errors_are_retried_then_succeed():
    with running([{"status": 500}, {"status": 429}, {"content": "fine"}]) as (url, requests):
        state = Agent(OpenAIPolicy(url, retries=2, backoff_s=0.01)).run("hi")
    assert state.answer == "fine" and len(requests) == 3


def test_a_client_error_is_not_retried_and_ends_the_run_readably():
    with running([{"status": 400}, {"content": "never"}]) as (url, requests):
        state = Agent(OpenAIPolicy(url, retries=2, backoff_s=0.01)).run("hi")
    assert (state.status, state.stop_reason) == (ERROR, "model_error")
    assert "rejected the request with HTTP 400" in state.error and len(requests) == 1


def test_an_unreachable_endpoint_is_a_model_error_with_the_transcript():
    state = Agent(OpenAIPolicy(closed_port_url(), retries=1, backoff_s=0.01, timeout_s=2)).run("hello?")
    assert (state.status, state.stop_reason) == (ERROR, "model_error")
    assert "could not be reached" in state.error and "after 2 attempts" in state.error
    assert state.messages[1] == {"role": "user", "content": "hello?"}
