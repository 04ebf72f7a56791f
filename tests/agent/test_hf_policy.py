"""The agent over real transformers models: the tiny random model (fast) and the embedded
SmolLM2 (slow), through the rollout `hf` backend."""

import pytest

from ponder.agent import Agent, AgentConfig, BackendPolicy, load_chat_policy
from ponder.config import SamplingConfig
from ponder.models import tiny_policy
from ponder.rollout.hf import HFBackend

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a city."}]


def greedy_backend():
    return HFBackend(tiny_policy(seed=3), SamplingConfig(temperature=0.0), seed=0)


def test_streamed_chunks_join_to_the_same_text_as_one_call():
    whole = BackendPolicy(greedy_backend()).complete(MESSAGES, [], 24, key="a")
    pieces = []
    streamed = BackendPolicy(greedy_backend(), stream_chunk_tokens=4).complete(MESSAGES, [], 24, key="a", on_text=pieces.append)
    assert len(pieces) >= 3  # 24 tokens in chunks of 4
    assert "".join(pieces) == streamed.text == whole.text
    assert streamed.completion_tokens == whole.completion_tokens == 24
    assert streamed.finish_reason == whole.finish_reason == "length"


def test_a_stop_string_spanning_two_chunks_ends_the_stream():
    text = BackendPolicy(greedy_backend()).complete(MESSAGES, [], 24, key="a").text
    stop = text[5:9]  # whatever the random model writes, cut it in the middle
    pieces = []
    streamed = BackendPolicy(greedy_backend(), stream_chunk_tokens=1).complete(MESSAGES, [stop], 24, key="a", on_text=pieces.append)
    assert streamed.text == text[: text.index(stop) + len(stop)] == "".join(pieces)
    assert streamed.finish_reason == "stop"


def test_an_hf_model_directory_runs_as_an_agent(tmp_path):
    policy = tiny_policy(seed=1)
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    chat = load_chat_policy(str(tmp_path), temperature=0.0, device="cpu")
    state = Agent(chat, config=AgentConfig(max_turns=2, max_new_tokens_per_turn=8)).run("hi")
    # A random model writes noise: the run must still end within its limits, with a record.
    assert state.finished and state.counters.turns <= 2
    assert state.counters.generated_tokens <= 16
    assert state.status in ("answered", "stopped")


@pytest.mark.slow
def test_embedded_model_uses_a_tool():
    from ponder.tools.builtin import calculator

    chat = load_chat_policy("smollm2-135m", temperature=0.0)
    config = AgentConfig(max_turns=3, max_new_tokens_per_turn=64)
    state = Agent(chat, [calculator], config).run("Use the calculator to compute 17 * 23.")
    assert state.finished and state.counters.turns >= 1
    assert state.status in ("answered", "stopped")


class RecordingBackend(HFBackend):
    """The real hf backend, keeping each request's constraint (what the agent asked for)."""

    def generate(self, requests, stop_strings):
        self.asked = [r.constraint for r in requests]
        return super().generate(requests, stop_strings)


def test_constrain_calls_samples_each_action_under_the_offered_tools_grammar():
    from ponder.tools.base import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first.
            b: the second.
        """
        return a + b

    backend = RecordingBackend(tiny_policy(seed=3), SamplingConfig(temperature=0.0), seed=0)
    config = AgentConfig(max_turns=1, max_new_tokens_per_turn=8, constrain_calls=True)
    Agent(BackendPolicy(backend, stream_chunk_tokens=4), [add], config=config).run("What is 2 + 3?")
    (constraint,) = backend.asked  # streaming in chunks is off for a constrained action
    assert constraint.trigger == "<tool_call>" and '"const": "add"' in constraint.source
    plain = RecordingBackend(tiny_policy(seed=3), SamplingConfig(temperature=0.0), seed=0)
    Agent(BackendPolicy(plain), [add], config=AgentConfig(max_turns=1, max_new_tokens_per_turn=8)).run("2 + 3?")
    assert plain.asked == [None]
    with pytest.raises(ValueError, match="constrain_calls needs style hermes"):
        AgentConfig(style="react", constrain_calls=True)
