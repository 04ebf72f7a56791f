"""Does reflection memory help? Repeated synthetic task families, with and without lessons.

Each family has a hidden rule that the judge checks and the task text does not state
(answer in capital letters; answer with digits only; start with "ANSWER:"). The agent
runs the tasks of a family in order. Conditions:
- `none`: no memory; every task starts from scratch;
- `model`: after a failure the model writes a lesson (Reflexion), recalled on later tasks;
- `feedback`: after a failure the judge's feedback is stored as the lesson.
Success on every task but the first of each family (the first can only be learned
from) is reported per condition, as JSON.

    .venv/bin/python bench/agent_reflection.py --tasks 6 --out runs/agent_reflection.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from pathlib import Path

FAMILIES = {
    "capitals-in-caps": {
        "feedback": "The answer must be written entirely in CAPITAL LETTERS.",
        "items": ["France", "Italy", "Japan", "Spain", "Egypt", "Canada", "Peru", "Kenya", "Norway", "India"],
        "task": "What is the capital of {item}?",
    },
    "sums-digits-only": {
        "feedback": "The answer must be only the number in digits, with no words or punctuation.",
        "items": [
            (12, 7),
            (30, 14),
            (8, 9),
            (41, 22),
            (5, 16),
            (27, 33),
            (19, 4),
            (60, 25),
            (13, 13),
            (72, 18),
        ],
        "task": "What is {item[0]} plus {item[1]}?",
    },
    "answer-prefix": {
        "feedback": 'The answer must start with "ANSWER:" followed by the answer.',
        "items": [
            "the sea",
            "a desert",
            "snow",
            "a forest",
            "the moon",
            "fire",
            "a city",
            "rain",
            "a mountain",
            "ice",
        ],
        "task": "Give one word that describes {item}.",
    },
}


def follows_rule(family: str, answer: str) -> bool:
    text = answer.strip()
    if family == "capitals-in-caps":
        letters = [c for c in text if c.isalpha()]
        return bool(letters) and all(c.isupper() for c in letters)
    if family == "sums-digits-only":
        return re.fullmatch(r"\d+", text) is not None
    return text.startswith("ANSWER:") and len(text) > len("ANSWER:")


def judge_for(family: str):
    def judge(state) -> tuple[bool, str]:
        answer = state.answer if isinstance(state.answer, str) else ""
        ok = follows_rule(family, answer)
        return ok, "" if ok else f"Wrong format: {FAMILIES[family]['feedback']}"

    return judge


def run_condition(condition: str, agent, tasks_per_family: int, encoder, workdir: Path) -> dict:
    from ponder.agent.longterm import LongTermMemory
    from ponder.agent.reflection import ReflectionMemory, run_with_reflection

    store = LongTermMemory(workdir / f"{condition}.sqlite", encoder=encoder)
    memory = ReflectionMemory(store, k=2)
    per_family, lessons = {}, {}
    for family, spec in FAMILIES.items():
        outcomes = []
        for index, item in enumerate(spec["items"][:tasks_per_family]):
            task = spec["task"].format(item=item)
            key = f"{condition}-{family}-{index}"
            if condition == "none":
                state = agent.run(task, key=key)
                outcomes.append(judge_for(family)(state)[0])
                print(f"  none {family} #{index}: answer={state.answer!r:.60}", flush=True)
                continue
            outcome = run_with_reflection(
                agent, task, family, memory, judge_for(family), key=key, lesson_source=condition
            )
            outcomes.append(outcome.success)
            print(f"  {condition} {family} #{index}: {'ok' if outcome.success else 'fail'} "
                  f"answer={outcome.state.answer!r:.60} lessons_used={len(outcome.lessons_used)}", flush=True)
            if outcome.lesson_written:
                lessons.setdefault(family, []).append(outcome.lesson_written)
        per_family[family] = outcomes
    later = [ok for outcomes in per_family.values() for ok in outcomes[1:]]
    store.close()
    return {
        "success_after_first": sum(later) / len(later),
        "n_scored": len(later),
        "per_family": per_family,
        "lessons": lessons,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=6, help="tasks per family (at most 10)")
    parser.add_argument("--conditions", default="none,model,feedback")
    parser.add_argument("--out", default="runs/agent_reflection.json")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy 2-core machine)")
    args = parser.parse_args()

    import torch

    from ponder.agent import Agent, AgentConfig, load_chat_policy
    from ponder.tools.retrieval import load_encoder

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    random.seed(0)
    policy = load_chat_policy(args.model, temperature=0.0)
    config = AgentConfig(max_turns=1, max_new_tokens_per_turn=32, instructions="Answer briefly.")
    agent = Agent(policy, [], config)
    encoder = load_encoder()
    results = {"model": args.model, "tasks_per_family": args.tasks, "conditions": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for condition in args.conditions.split(","):
            started = time.monotonic()
            outcome = run_condition(condition, agent, args.tasks, encoder, Path(workdir))
            outcome["seconds"] = round(time.monotonic() - started, 1)
            results["conditions"][condition] = outcome
            _write(args.out, results)  # after each condition, so a cut run keeps what it measured
            print(
                f"{condition:>9}: success after the first task of each family = "
                f"{outcome['success_after_first']:.2f} ({outcome['n_scored']} tasks, {outcome['seconds']} s)",
                flush=True,
            )
    print(f"wrote {args.out}")


def _write(path: str, results: dict) -> None:
    from ponder.fileio import write_text_atomic

    write_text_atomic(path, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
