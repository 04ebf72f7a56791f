import pytest

from ponder.agent import Agent, AgentConfig, AgentState, BackendPolicy
from ponder.agent.longterm import LongTermMemory, MemoryStoreError
from ponder.agent.openai_http import OpenAIPolicy
from ponder.agent.prompt import LESSONS_HEADER
from ponder.agent.reflection import ReflectionMemory, clean_lesson, run_with_reflection
from ponder.agent.window import extractive_summary, fit_window
from ponder.rollout.scripted import ScriptedBackend
from ponder.tools import ToolRegistry
from ponder.tools.retrieval import load_encoder
from ponder.types import ToolCall

from .conftest import call, lookup
from .openai_server import running

WORDS = len  # one "token" per character keeps the arithmetic readable


def conversation(n_exchanges):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "task"}]
    for i in range(n_exchanges):
        messages += [{"role": "assistant", "content": f"a{i}" * 5}, {"role": "user", "content": f"o{i}" * 5}]
    return messages


def test_window_keeps_head_and_newest_exchanges_within_budget():
    messages = conversation(4)  # each exchange is 20 characters
    shown = fit_window(messages, 45, WORDS, "drop")
    assert shown[:2] == messages[:2]
    assert shown[2] == {"role": "user", "content": "(4 earlier messages were left out to fit the context window.)"}
    assert shown[3:] == messages[-4:]
    assert fit_window(messages, 0, WORDS) == messages and fit_window(messages, 1000, WORDS) == messages


def test_window_always_keeps_the_newest_exchange():
    shown = fit_window(conversation(3), 1, WORDS, "drop")
    assert shown[-2:] == conversation(3)[-2:] and len(shown) == 5


def test_window_summarize_mode():
    shown = fit_window(conversation(3), 25, WORDS, "summarize")
    assert shown[2]["content"] == "Summary of the earlier conversation:\n" + extractive_summary(conversation(3)[2:6])
    assert shown[2]["content"].splitlines()[1] == "assistant: a0a0a0a0a0"


def test_agent_prompt_respects_the_window_while_the_transcript_keeps_everything():
    replies = [{"content": call("lookup", query=f"q{i}")} for i in range(4)] + [{"content": "done"}]
    with running(replies) as (url, requests):
        config = AgentConfig(window_tokens=30)  # the HTTP policy counts 4 characters a token
        state = Agent(OpenAIPolicy(url), [lookup], config).run("task")
    assert len(state.messages) == 2 + 2 * 4 + 1
    last_prompt = requests[-1]["messages"]
    assert len(last_prompt) < len(state.messages) - 1
    assert "earlier messages were left out" in last_prompt[2]["content"]
    assert last_prompt[-1]["content"] == state.messages[-2]["content"]


@pytest.fixture(scope="module")
def encoder():
    return load_encoder()


def test_long_term_memory_recalls_by_meaning_and_persists(tmp_path, encoder):
    path = tmp_path / "memory.sqlite"
    memory = LongTermMemory(path, encoder=encoder)
    memory.add("The user's dog is called Biscuit.", family="pets")
    memory.add("Invoices are due on the 5th of each month.", kind="fact", family="billing")
    memory.add("The office wifi password rotates every Monday.", family="it")
    memory.close()
    reopened = LongTermMemory.from_handle({"path": str(path), "namespace": "default"}, encoder=encoder)
    best = reopened.recall("what is the name of my puppy?", k=1)
    assert [m.text for m in best] == ["The user's dog is called Biscuit."] and best[0].score > 0.3
    assert [m.text for m in reopened.recall("payment deadline", k=3, kind="fact")] == ["Invoices are due on the 5th of each month."]
    assert reopened.recall("anything", k=5, family="nope") == []
    assert reopened.count() == 3
    other = LongTermMemory(path, namespace="other", encoder=encoder)
    assert other.recall("dog", k=3) == []  # namespaces do not see each other
    with pytest.raises(ValueError, match="empty note"):
        reopened.add("   ")


def test_memory_tools_for_an_agent(tmp_path, encoder):
    memory = LongTermMemory(tmp_path / "m.sqlite", encoder=encoder)
    registry = ToolRegistry(memory.tools())
    assert registry.call(ToolCall("recall", {"query": "x"})).content == "nothing remembered yet"
    assert registry.call(ToolCall("remember", {"note": "Paris is the capital of France."})).content == "remembered (id 1)"
    assert registry.call(ToolCall("recall", {"query": "French capital"})).content == "- Paris is the capital of France."


def test_an_unusable_memory_file_is_one_line(tmp_path, encoder):
    (tmp_path / "dir.sqlite").mkdir()
    with pytest.raises(MemoryStoreError, match="cannot open memory database"):
        LongTermMemory(tmp_path / "dir.sqlite", encoder=encoder)


def test_clean_lesson():
    assert clean_lesson("\n- Lesson: Always shout.\nMore text") == "Always shout."
    assert clean_lesson("   ") == ""


def shout_judge(state):
    ok = isinstance(state.answer, str) and state.answer.isupper()
    return ok, "" if ok else "the answer must be written in capital letters"


def test_reflection_cycle_writes_a_lesson_and_uses_it_next_time(tmp_path, encoder, tokenizer):
    scripts = {
        "t1": ["paris"],
        "reflect-t1": ["Lesson: Write every answer in CAPITAL LETTERS.\n"],
        "t2": ["ROME"],
    }
    agent = Agent(BackendPolicy(ScriptedBackend(tokenizer, scripts)), [], AgentConfig())
    memory = ReflectionMemory(LongTermMemory(tmp_path / "lessons.sqlite", encoder=encoder))
    first = run_with_reflection(agent, "Capital of France?", "capitals", memory, shout_judge, key="t1")
    assert (first.success, first.lessons_used, first.lesson_written) == (False, [], "Write every answer in CAPITAL LETTERS.")
    second = run_with_reflection(agent, "Capital of Italy?", "capitals", memory, shout_judge, key="t2")
    assert second.success and second.lessons_used == ["Write every answer in CAPITAL LETTERS."]
    assert LESSONS_HEADER + "\n- Write every answer in CAPITAL LETTERS." in second.state.messages[0]["content"]
    assert memory.lessons_for("other-family", "Capital of Spain?") == []
    # The state names the memory it used, so a resumed run can reopen it.
    restored = AgentState.from_json(second.state.to_json())
    assert restored.memory["long_term"]["path"] == str(tmp_path / "lessons.sqlite")
    assert restored.memory["reflection"]["lessons_used"] == ["Write every answer in CAPITAL LETTERS."]


def test_feedback_lessons_need_no_model_call(tmp_path, encoder, tokenizer):
    agent = Agent(BackendPolicy(ScriptedBackend(tokenizer, {"t1": ["paris"]})), [], AgentConfig())
    memory = ReflectionMemory(LongTermMemory(tmp_path / "l.sqlite", encoder=encoder))
    outcome = run_with_reflection(agent, "Capital?", "caps", memory, shout_judge, key="t1", lesson_source="feedback")
    assert outcome.lesson_written == "the answer must be written in capital letters"
