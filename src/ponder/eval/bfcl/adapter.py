"""Run a ponder chat policy on BFCL's single-turn categories and score it with BFCL's checker.

Per category: a seeded subset of questions → the functions offered (the question's
own, as in BFCL, or the top-k tools retrieved from the whole catalogue) → BFCL's
prompt (built by bfcl-eval in its venv) → the policy's reply → BFCL's decoder and AST
checker (in its venv). The scripted `OraclePolicy` replays a possible answer of each
question and must score 100%: that proves prompt, transport and scoring end to end.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.agent.policy import ChatPolicy, Completion
from ponder.bfcl.answers import oracle_reply
from ponder.bfcl.bridge import BfclBridge
from ponder.bfcl.data import ADAPTER_CATEGORIES, BfclQuestion, ToolCorpus, load_questions


@dataclass
class BfclRunConfig:
    """Settings of a BFCL run.

    categories: single-turn categories to run (python ones: the oracle covers these).
    per_category: questions per category, a seeded random subset (0 = all).
    seed: the subset's seed.
    samples: replies per question (pass@k needs samples >= k; > 1 needs temperature > 0).
    max_new_tokens: cap on one reply.
    retrieval_topk: 0 offers the question's own functions (BFCL as published); k > 0
        offers the k tools retrieved from the whole catalogue for the question.
    batch_size: questions per batched generation of a local model.
    """

    categories: tuple[str, ...] = ADAPTER_CATEGORIES
    per_category: int = 50
    seed: int = 0
    samples: int = 1
    max_new_tokens: int = 256
    retrieval_topk: int = 0
    batch_size: int = 8


@dataclass
class BfclSample:
    """One reply to one question and BFCL's verdict on it."""

    id: str
    category: str
    sample: int
    text: str
    valid: bool
    error_type: str
    calls: list[dict[str, Any]]
    needed: list[str]
    offered: list[str]
    reference: str
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def subset(questions: list[BfclQuestion], n: int, seed: int) -> list[BfclQuestion]:
    """A seeded random subset of n questions in data order (all when n is 0 or too large)."""
    if n <= 0 or n >= len(questions):
        return list(questions)
    keep = set(random.Random(f"{seed}:{questions[0].category}").sample(range(len(questions)), n))
    return [q for i, q in enumerate(questions) if i in keep]


class OraclePolicy:
    """A scripted chat policy that replays a possible answer per question id (the key)."""

    name = "oracle"

    def __init__(self, questions: list[BfclQuestion]) -> None:
        self.replies = {q.id: oracle_reply(q) for q in questions}

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def complete(self, messages: list[dict[str, Any]], stop: list[str], max_new_tokens: int, key: str,
                 on_text: Any = None, timeout_s: float | None = None) -> Completion:
        text = self.replies[key.split("#")[0]]
        return Completion(text, 0, len(text.split()), "eos")


Retrieve = Callable[[list[str], int], list[list[str]]]


def offered_functions(question: BfclQuestion, corpus: ToolCorpus | None, names: list[str] | None) -> list[dict[str, Any]]:
    """The question's own functions, or the retrieved names: a question's own definition of a
    retrieved name is used where it has one (its environment's version of the tool)."""
    if names is None:
        return list(question.functions)
    own = {f["name"]: f for f in question.functions}
    return [own.get(name) or corpus.definitions[name] for name in names]


def run_category(
    policy: ChatPolicy, bridge: BfclBridge, data_dir: Path, category: str, config: BfclRunConfig,
    corpus: ToolCorpus | None = None, retrieve: Retrieve | None = None,
) -> list[BfclSample]:
    """Every sample of every chosen question of one category, scored by BFCL."""
    questions = subset(load_questions(data_dir, category), config.per_category, config.seed)
    retrieved: list[list[str]] | list[None] = [None] * len(questions)
    if config.retrieval_topk > 0:
        if retrieve is None or corpus is None:
            raise ValueError("retrieval_topk > 0 needs a tool index and the tool corpus")
        retrieved = retrieve([q.query for q in questions], config.retrieval_topk)
    offered = [offered_functions(q, corpus, names) for q, names in zip(questions, retrieved)]
    entries = [{"id": q.id, "question": [q.messages], "function": f} for q, f in zip(questions, offered)]
    chats = bridge.prompts(category, entries)
    jobs = [(q, f, chat, index) for q, f, chat in zip(questions, offered, chats) for index in range(config.samples)]
    replies = complete_all(policy, [(chat, f"{q.id}#{index}") for q, _, chat, index in jobs], config)
    samples, items = [], []
    for (question, functions, _, index), (text, seconds) in zip(jobs, replies):
        samples.append(BfclSample(question.id, category, index, text, False, "", [],
                                  sorted(question.answer_names_list()), [f["name"] for f in functions],
                                  oracle_reply(question), seconds))
        items.append({"id": question.id, "text": text, "function": question.functions,
                      "ground_truth": question.ground_truth})
    for sample, verdict in zip(samples, bridge.check(category, items)):
        sample.valid, sample.error_type = verdict["valid"], verdict.get("error_type") or ""
        decoded = verdict.get("decoded")
        sample.calls = [c for c in decoded if _is_call(c)] if isinstance(decoded, list) else []
    return samples


def _is_call(item: Any) -> bool:
    """BFCL's decoded call shape: {name: {argument: value}}."""
    return isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), dict)


def complete_all(policy: ChatPolicy, chats: list[tuple[list[dict[str, Any]], str]],
                 config: BfclRunConfig) -> list[tuple[str, float]]:
    """(reply, seconds) per (chat, key). A local model answers `config.batch_size` chats per
    batched generation (much cheaper per reply on CPU); seconds is the batch's time share."""
    from ponder.agent.policy import BackendPolicy
    from ponder.rollout.backend import GenerationRequest

    replies: list[tuple[str, float]] = []
    if not isinstance(policy, BackendPolicy):
        for chat, key in chats:
            started = time.perf_counter()
            text = policy.complete(chat, [], config.max_new_tokens, key).text
            replies.append((text, time.perf_counter() - started))
        return replies
    for start in range(0, len(chats), config.batch_size):
        chunk = chats[start : start + config.batch_size]
        started = time.perf_counter()
        requests = [GenerationRequest(key, policy.render(chat), config.max_new_tokens) for chat, key in chunk]
        generations = policy.backend.generate(requests, [])
        share = (time.perf_counter() - started) / len(chunk)
        replies.extend((generation.text, share) for generation in generations)
    return replies
