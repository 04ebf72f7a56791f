"""Reflection memory: learning from failures without changing weights (Reflexion-style).

After a failed episode the agent writes a one-sentence lesson, stored in long-term
memory with the task family; on later tasks of that family the most similar lessons
are put into the system prompt. `run_with_reflection` is the whole cycle:
recall lessons → run → judge → (on failure) write and store a lesson.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ponder.agent.loop import Agent
from ponder.agent.longterm import LongTermMemory
from ponder.agent.state import AgentState
from ponder.agent.window import extractive_summary

LESSON_KIND = "lesson"
LESSON_PROMPT = """You tried a task and failed.
Task: {task}
What you did:
{summary}
Why it failed: {feedback}
Write one short lesson, one sentence, that would help you succeed at similar tasks next time. Reply with the lesson only."""

Judge = Callable[[AgentState], tuple[bool, str]]


@dataclass
class ReflectionOutcome:
    """One episode of the cycle: the run, the judge's verdict, lessons used and written."""

    state: AgentState
    success: bool
    feedback: str
    lessons_used: list[str]
    lesson_written: str | None


class ReflectionMemory:
    """Lessons by task family in a LongTermMemory; `k` lessons are recalled per task."""

    def __init__(self, store: LongTermMemory, k: int = 3) -> None:
        self.store = store
        self.k = k

    def lessons_for(self, family: str, task: str) -> list[str]:
        return [m.text for m in self.store.recall(task, k=self.k, kind=LESSON_KIND, family=family)]

    def add_lesson(self, family: str, task: str, lesson: str) -> int:
        return self.store.add(lesson, kind=LESSON_KIND, family=family, metadata={"task": task})


def clean_lesson(text: str, max_chars: int = 300) -> str:
    """The first non-empty line, without a "Lesson:" label, cut to `max_chars`."""
    for line in text.splitlines():
        line = line.strip().strip("-*• ").strip()
        if line.lower().startswith("lesson:"):
            line = line[len("lesson:") :].strip()
        if line:
            return line[:max_chars]
    return ""


def write_lesson(agent: Agent, state: AgentState, feedback: str, max_new_tokens: int = 40) -> str:
    """Ask the agent's model for a lesson about the failed run; "" if it wrote none."""
    summary = extractive_summary(state.messages[2:]) or "(nothing)"
    prompt = LESSON_PROMPT.format(task=state.task, summary=summary, feedback=feedback)
    messages = [{"role": "user", "content": prompt}]
    completion = agent.policy.complete(messages, [], max_new_tokens, key=f"reflect-{state.key}")
    return clean_lesson(completion.text)


def run_with_reflection(
    agent: Agent,
    task: str,
    family: str,
    memory: ReflectionMemory,
    judge: Judge,
    key: str | None = None,
    lesson_source: str = "model",
) -> ReflectionOutcome:
    """Recall lessons, run the task, judge it, and on failure store a new lesson.

    `lesson_source`: "model" (the model reflects; the judge's feedback is the fallback
    when it writes nothing usable) or "feedback" (the judge's feedback is the lesson).
    """
    if lesson_source not in ("model", "feedback"):
        raise ValueError(f"lesson_source must be 'model' or 'feedback', got {lesson_source!r}")
    lessons = memory.lessons_for(family, task)
    state = agent.run(agent.start(task, key=key, lessons=lessons))
    success, feedback = judge(state)
    lesson = None
    if not success:
        lesson = write_lesson(agent, state, feedback) if lesson_source == "model" else ""
        lesson = lesson or feedback
        memory.add_lesson(family, task, lesson)
    state.memory["reflection"] = {"family": family, "lessons_used": lessons, "lesson_written": lesson}
    state.memory["long_term"] = memory.store.handle()
    return ReflectionOutcome(state, success, feedback, lessons, lesson)
