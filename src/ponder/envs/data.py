"""The search-QA data its options name: a corpus and train/eval task splits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ponder.envs.synthetic import generate_world
from ponder.envs.taskfile import load_tasks
from ponder.tools.retrieval import Document, load_corpus
from ponder.types import Task

if TYPE_CHECKING:
    from ponder.envs.search_qa import SearchQAOptions


@dataclass
class SearchQAData:
    corpus: list[Document]
    train: list[Task]
    eval: list[Task]


def load_search_qa(cfg: SearchQAOptions) -> SearchQAData:
    """Files when the options (corpus, tasks) name them, else the deterministic
    synthetic world of `taskgen`.

    A tasks file is an evaluation set: all its tasks form the eval split. A corpus
    file replaces the synthetic corpus (the synthetic tasks still need their own
    facts, so give both files or neither unless you know the corpus covers them).
    """
    world = None
    if not cfg.corpus or not cfg.tasks:
        world = generate_world(cfg.taskgen)
    if cfg.corpus:
        corpus = load_corpus(cfg.corpus)
    else:
        assert world is not None
        corpus = [Document(row["id"], row["contents"]) for row in world.corpus]
    if cfg.tasks:
        return SearchQAData(corpus, [], load_tasks(cfg.tasks))
    assert world is not None
    return SearchQAData(corpus, world.train, world.eval)
