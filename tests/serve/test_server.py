"""`ponder serve` on 127.0.0.1 against the real `openai` client and LangChain's ChatOpenAI:
plain chat, streaming, tool-call round trips, adapters by name, batching, and every
bad input with its status, the server still serving afterwards."""

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from ponder.config import SamplingConfig
from ponder.models import tiny_policy
from ponder.models.adapters import find_trained, merge_adapter
from ponder.rollout.backend import GenerationRequest
from ponder.rollout.hf import HFBackend

from .conftest import API_KEY, FINAL_ANSWER, JSON_QUESTION, JSON_SCHEMA, QUESTION, TOOL_RESULT, WEATHER_TOOL

HI = [{"role": "user", "content": "Say something."}]


def local_greedy(policy, messages, max_tokens):
    """What the model writes, generated here without the server."""
    tokenizer = policy.tokenizer
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    backend = HFBackend(policy, SamplingConfig(temperature=0.0), reuse_kv=False)
    return backend.generate([GenerationRequest("k", ids, max_tokens)], [])[0].text


def ask(client, model="tiny", messages=HI, **fields):
    return client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=12, **fields)


def still_serving(client):
    reply = ask(client)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0


# --- plain chat, streaming, completions ------------------------------------------------


def test_models_lists_the_base_and_every_adapter(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny", "alpha", "beta", "weather"]
    assert client.models.retrieve("beta").id == "beta"


def test_chat_answers_what_the_model_writes(client):
    reply = ask(client)
    expected = local_greedy(tiny_policy(), HI, 12)
    assert reply.choices[0].message.content == expected
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 12 and reply.usage.prompt_tokens > 0
    assert reply.model == "tiny" and reply.id.startswith("chatcmpl-")


def test_streaming_sends_the_same_text_in_chunks_and_ends_with_done(client, served):
    whole = ask(client, model="alpha").choices[0].message.content
    stream = ask(client, model="alpha", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole and len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12
    with httpx.stream("POST", f"{served.url}/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": "tiny", "messages": HI, "max_tokens": 3, "stream": True}) as raw:  # fmt: skip
        lines = [line for line in raw.iter_lines() if line]
    assert raw.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"


def test_stop_strings_cut_the_reply_before_them(client):
    whole = ask(client, model="alpha").choices[0].message.content
    stop = whole[5:7]
    reply = ask(client, model="alpha", stop=[stop])
    assert reply.choices[0].message.content == whole[: whole.find(stop)]
    assert reply.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in ask(client, model="alpha", stop=[stop], stream=True))
    assert streamed == whole[: whole.find(stop)]


def test_completions_continue_the_raw_prompt(client):
    first = client.completions.create(model="alpha", prompt="The weather", max_tokens=8, temperature=0)
    assert first.object == "text_completion" and first.choices[0].finish_reason == "length"
    both = client.completions.create(model="alpha", prompt=["The weather", "Hello"], max_tokens=8, temperature=0)
    assert both.choices[0].text == first.choices[0].text and len(both.choices) == 2
    echoed = client.completions.create(model="alpha", prompt="The weather", max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == "The weather" + first.choices[0].text
    streamed = client.completions.create(model="alpha", prompt="The weather", max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == first.choices[0].text


def test_sampling_with_n_gives_n_choices(client):
    reply = client.chat.completions.create(model="alpha", messages=HI, max_tokens=6, temperature=1.0, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2] and reply.usage.completion_tokens <= 18


# --- tools ------------------------------------------------------------------------------


def test_tool_call_round_trip_with_the_openai_client(client):
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model="weather", messages=messages, tools=[WEATHER_TOOL], temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]  # fmt: skip
    final = client.chat.completions.create(model="weather", messages=messages, tools=[WEATHER_TOOL], temperature=0)
    assert final.choices[0].message.content == FINAL_ANSWER and final.choices[0].finish_reason == "stop"
    assert not final.choices[0].message.tool_calls


def test_streamed_tool_calls_arrive_as_deltas(client):
    stream = client.chat.completions.create(model="weather", messages=[{"role": "user", "content": QUESTION}],
                                            tools=[WEATHER_TOOL], temperature=0, stream=True)  # fmt: skip
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""  # the call's text is not content
    calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(0, "get_weather", {"city": "Paris"})]  # fmt: skip
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_langchain_bind_tools_round_trip(served):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return TOOL_RESULT

    llm = ChatOpenAI(model="weather", base_url=served.url, api_key=API_KEY, temperature=0, max_retries=0)
    bound = llm.bind_tools([WEATHER_TOOL])
    messages = [HumanMessage(QUESTION)]
    ai = bound.invoke(messages)
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("get_weather", {"city": "Paris"})]
    messages += [ai, ToolMessage(get_weather.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"])]
    assert bound.invoke(messages).content == FINAL_ANSWER
    plain = ChatOpenAI(model="alpha", base_url=served.url, api_key=API_KEY, temperature=0, max_tokens=12)
    streamed = "".join(chunk.content for chunk in plain.stream("Say something."))
    assert streamed == plain.invoke("Say something.").content != ""


def test_named_tool_choice_gets_a_valid_call_from_a_model_that_can(client):
    forced = {"type": "function", "function": {"name": "get_weather"}}
    reply = client.chat.completions.create(model="weather", messages=[{"role": "user", "content": QUESTION}],
                                           tools=[WEATHER_TOOL], tool_choice=forced, temperature=0)  # fmt: skip
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_response_format_json_schema(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": JSON_SCHEMA}}
    reply = client.chat.completions.create(model="weather", messages=[{"role": "user", "content": JSON_QUESTION}],
                                           response_format=response_format, temperature=0)  # fmt: skip
    assert json.loads(reply.choices[0].message.content) == {"city": "Paris"}


# --- adapters and batching ---------------------------------------------------------------


def test_adapters_by_name_give_their_own_deterministic_answers(client, adapter_paths):
    answers = {model: ask(client, model=model).choices[0].message.content for model in ("tiny", "alpha", "beta")}
    assert len(set(answers.values())) == 3
    assert ask(client, model="beta").choices[0].message.content == answers["beta"]
    alpha = merge_adapter(tiny_policy(), find_trained(adapter_paths["alpha"]))
    assert answers["alpha"] == local_greedy(alpha, HI, 12)
    beta = merge_adapter(tiny_policy(), adapter_paths["beta"])
    assert answers["beta"] == local_greedy(beta, HI, 12)


def test_concurrent_requests_are_batched_and_keep_their_adapters(served):
    models = ["tiny", "alpha", "beta"] * 4
    prompts = [[{"role": "user", "content": f"Question number {i}?"}] for i in range(len(models))]

    async def run(concurrently):
        async with openai.AsyncOpenAI(base_url=served.url, api_key=API_KEY, max_retries=0) as aclient:
            calls = [aclient.chat.completions.create(model=m, messages=p, temperature=0, max_tokens=10)
                     for m, p in zip(models, prompts)]  # fmt: skip
            if concurrently:
                replies = await asyncio.gather(*calls)
            else:
                replies = [await call for call in calls]
        return [r.choices[0].message.content for r in replies]

    sizes = served.model_server.generator.batch_sizes
    alone = asyncio.run(run(False))
    before = len(sizes)
    together = asyncio.run(run(True))
    assert together == alone  # a base request never comes back with an adapter applied, nor one adapter's with another's
    assert max(sizes[before:]) > 1 and len(sizes) - before < len(models)


# --- bad input ----------------------------------------------------------------------------


def post(served, body, key=API_KEY, path="/chat/completions"):
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"} if key else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(served.url + path, content=content, headers=headers, timeout=60)


@pytest.mark.parametrize(
    "body, key, status, code",
    [
        (b'{"model": "tiny", "messages": [', API_KEY, 400, "invalid_json"),
        (b"[1, 2]", API_KEY, 400, "invalid_request"),
        ({"model": "nope", "messages": HI}, API_KEY, 404, "model_not_found"),
        ({"model": "tiny", "messages": HI, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}]},
         API_KEY, 400, "invalid_request"),
        ({"model": "tiny", "messages": HI, "max_tokens": 65}, API_KEY, 400, "max_tokens_too_large"),
        ({"model": "tiny", "messages": HI, "n": 9}, API_KEY, 400, "invalid_request"),
        ({"model": "tiny", "messages": HI}, None, 401, "invalid_api_key"),
        ({"model": "tiny", "messages": HI}, "wrong-key", 401, "invalid_api_key"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x" * 250_000}]}, API_KEY, 413, "request_too_large"),
    ],
)
def test_bad_input_gets_its_status_and_an_openai_error_body(served, client, body, key, status, code):
    response = post(served, body, key)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "\n" not in error["message"]
    still_serving(client)


def test_a_body_over_the_limit_is_refused_while_it_is_read(served, client):
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 250_000}]}).encode()

    def chunks():  # no Content-Length: the server counts while reading
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    response = httpx.post(f"{served.url}/chat/completions", content=chunks(),
                          headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    still_serving(client)


def test_the_openai_client_sees_typed_errors(client):
    with pytest.raises(openai.NotFoundError, match="the model 'gpt-4' does not exist; this server has: tiny"):
        ask(client, model="gpt-4")
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\].function.parameters is not a valid JSON Schema"):
        ask(client, tools=[bad_tool])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=str(client.base_url), api_key="nope", max_retries=0).models.list()
    unknown = httpx.get(str(client.base_url) + "nowhere")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    still_serving(client)


def test_a_client_leaving_mid_stream_does_not_stop_the_server(served, client):
    body = {"model": "alpha", "messages": HI, "max_tokens": 64, "stream": True}
    done = threading.Event()

    def leave_early():
        with httpx.stream("POST", f"{served.url}/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as response:  # fmt: skip
            for line in response.iter_lines():
                if line.startswith("data:") and json.loads(line[5:])["choices"][0]["delta"].get("content"):
                    break  # close the connection after the first piece of text
        done.set()

    cancelled = served.model_server.generator.cancelled
    for _ in range(3):
        worker = threading.Thread(target=leave_early)
        worker.start()
        worker.join(30)
    assert done.is_set()
    still_serving(client)
    # the rows of clients that left end early; the batcher counts each at its next token,
    # which can come after this thread gets here. A 64-token row of the tiny model can also
    # finish before the server sees its client go (2 of 3 were seen in one CI run), so at
    # least one of the three must have been cut short, never more than three.
    deadline = time.monotonic() + 15
    while served.model_server.generator.cancelled < cancelled + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled + 1 <= served.model_server.generator.cancelled <= cancelled + 3
    reply = ask(client, model="beta", stream=True)
    assert [c.choices[0].finish_reason for c in reply if c.choices][-1] == "length"
