"""A real `ponder serve` on a free loopback port, the tiny model and three adapters:

- `alpha`: random non-zero LoRA B matrices (seed 3), saved as a ponder run's checkpoint
  (`save_checkpoint`: checkpoints/latest → step-000002) and served from the run dir;
- `beta`: another random LoRA (seed 2), a plain PEFT directory as `ponder export` writes;
- `weather`: a LoRA trained here (a few hundred Adam steps on the tiny model) to answer
  the weather prompts below exactly as their transcripts say: a `get_weather` call,
  then a plain answer once the tool's result is back, JSON under a response_format, and
  the call's arguments after the opening a named tool_choice puts in the prompt.
  The tiny model's own text is gibberish; this adapter is how a tool round trip can
  be tested deterministically, through the server's own prompt rendering.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ponder.config import LoraConfig
from ponder.models import apply_lora, tiny_policy
from ponder.models.adapters import save_trained
from ponder.serve import ModelServer, ServeConfig, build_server
from ponder.serve.chat import plan_chat
from ponder.serve.protocol import ChatRequest
from ponder.train.checkpoint import save_checkpoint

from ..tiny_lora import random_lora
from ..uvicorn_thread import loopback_socket, serving

API_KEY = "test-key"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = "What is the weather in Paris?"
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL_RESULT = "sunny, 24 C"
FINAL_ANSWER = "It is sunny in Paris."
JSON_QUESTION = "Give the city as JSON."
JSON_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_ANSWER = '{"city": "Paris"}'


def weather_transcripts() -> list[tuple[dict, str]]:
    """(chat request body, the reply the weather adapter is trained to give)."""
    first = {"model": "weather", "messages": [{"role": "user", "content": QUESTION}], "tools": [WEATHER_TOOL]}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    second = {**first, "messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
    ]}  # fmt: skip
    json_body = {"model": "weather", "messages": [{"role": "user", "content": JSON_QUESTION}],
                 "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": JSON_SCHEMA}}}
    named = {**first, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    return [(first, CALL_TEXT), (second, FINAL_ANSWER), (json_body, JSON_ANSWER), (named, CALL_TEXT)]


def assert_tool_round_trip(client, model: str = "weather") -> list[dict]:
    """The weather adapter served as `model` calls get_weather for Paris, then answers from
    the tool's result (through the `openai` client); returns the conversation so far."""
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL], temperature=0)
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]  # fmt: skip
    final = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL], temperature=0)
    assert final.choices[0].message.content == FINAL_ANSWER
    return messages


def train_weather_adapter(steps: int = 150, base=None, lr: float = 1e-2, model: str = "weather"):
    """A LoRA on `base` (default the tiny model) that has learnt the weather transcripts by heart."""
    return train_adapter(weather_transcripts(), steps, base, lr, model)


def train_adapter(transcripts: list[tuple[dict, str]], steps: int, base=None, lr: float = 1e-2,
                  model: str = "weather"):  # fmt: skip
    """A LoRA on `base` (default the tiny model) that has learnt `transcripts` (chat request
    body, reply), rendered as the server renders them, by heart."""
    policy = apply_lora(base if base is not None else tiny_policy(), LoraConfig(r=16, alpha=32))
    tokenizer = policy.tokenizer
    examples = []
    for body, reply in transcripts:
        plan = plan_chat(ChatRequest.model_validate({**body, "model": model}))
        prompt = tokenizer.apply_chat_template(plan.messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        reply_ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        examples.append((torch.tensor([prompt_ids + reply_ids]), len(prompt_ids)))
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=lr)
    torch.manual_seed(0)
    policy.model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        for ids, start in examples:
            logits = policy.model(input_ids=ids).logits[0, start - 1 : -1]
            torch.nn.functional.cross_entropy(logits, ids[0, start:]).backward()
        optimizer.step()
    policy.model.eval()
    return policy


@pytest.fixture(scope="session")
def adapter_paths(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    alpha_run = root / "alpha-run"
    save_checkpoint(alpha_run, 2, random_lora(3), {})
    beta = root / "beta-export"
    save_trained(random_lora(2), beta)
    (beta / "ponder.json").unlink()  # a plain PEFT directory, as `ponder export` leaves it
    weather = root / "weather"
    save_trained(train_weather_adapter(), weather)
    return {"alpha": alpha_run, "beta": beta, "weather": weather}


@dataclass
class Running:
    url: str  # API root, http://127.0.0.1:PORT/v1
    model_server: ModelServer


@contextlib.contextmanager
def running_server(config: ServeConfig):
    """`config` served from a background thread on a free loopback port."""
    model_server = ModelServer.load(config)
    try:
        with serving(build_server(model_server, log_level="warning"), loopback_socket()) as port:
            yield Running(f"http://127.0.0.1:{port}/v1", model_server)
    finally:
        model_server.close()


@pytest.fixture(scope="module")
def served(adapter_paths):
    """tiny + alpha, beta, weather, with an API key and small limits."""
    adapters = {name: str(path) for name, path in adapter_paths.items()}
    config = ServeConfig(model="tiny", adapters=adapters, api_key=API_KEY, max_tokens_limit=64,
                         max_body_bytes=200_000, batch_window_ms=20)  # fmt: skip
    with running_server(config) as running:
        yield running


@pytest.fixture
def client(served):
    from openai import OpenAI

    with OpenAI(base_url=served.url, api_key=API_KEY, max_retries=0, timeout=60) as openai_client:
        yield openai_client
