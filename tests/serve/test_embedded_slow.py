"""`ponder serve` with the embedded SmolLM2-135M: a plain answer, streaming, and a tool
round trip through a LoRA trained here for a few steps on the weather transcripts
(SmolLM2-135M alone does not write valid calls: asked for get_weather it writes no
`city`), served by name next to the base."""

import json

import openai
import pytest

from ponder.models import load_policy
from ponder.models.adapters import save_trained
from ponder.serve import ServeConfig

from .conftest import WEATHER_TOOL, assert_tool_round_trip, running_server, train_weather_adapter

pytestmark = pytest.mark.slow


def test_embedded_model_serves_answers_and_a_trained_tool_adapter(tmp_path):
    adapter = train_weather_adapter(steps=40, base=load_policy("smollm2-135m", device="cpu"), lr=2e-3)
    save_trained(adapter, tmp_path / "weather")
    del adapter
    config = ServeConfig(model="smollm2-135m", adapters={"weather": str(tmp_path / "weather")}, device="cpu",
                         backend="hf")  # ponder's own backend (test_vllm_slow.py: vllm)
    with running_server(config) as served:
        client = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=300)
        capital = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model="smollm2-135m", messages=capital, temperature=0, max_tokens=24)
        assert "Paris" in reply.choices[0].message.content
        streamed = client.chat.completions.create(model="smollm2-135m", messages=capital, temperature=0,
                                                  max_tokens=24, stream=True)  # fmt: skip
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
            reply.choices[0].message.content  # fmt: skip

        messages = assert_tool_round_trip(client)
        base = client.chat.completions.create(model="smollm2-135m", messages=messages[:1], tools=[WEATHER_TOOL],
                                              temperature=0, max_tokens=48)  # fmt: skip
        assert not base.choices[0].message.tool_calls  # the same request without the adapter: no call
