"""Task files and corpora with arbitrary bytes: tasks (documents) of the right types, or
one line naming the file and the line (TaskFileError, CorpusError), nothing else."""

import json
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from ponder.envs.base import load_tasks_from
from ponder.envs.taskfile import TaskFileError, load_tasks
from ponder.tools.retrieval.corpus import CorpusError, Document, load_corpus
from ponder.types import Task

from .conftest import ANY_TEXT, fuzz_pair, one_line_error

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), ANY_TEXT)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
                           max_leaves=12)  # fmt: skip
TASK_KEYS = ["id", "question", "answers", "kind", "context", "needs_search", "oracle_actions", "metadata", "extra"]
DOC_KEYS = ["id", "contents", "title", "metadata"]


def rows(keys: list[str], required: dict[str, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    """Lines of JSON objects: plausible rows (the `required` keys with values of their
    type, most of the time) and rows over the format's keys with values of any JSON type,
    written raw or with \\uXXXX escapes, with raw bytes, blank lines, deep nesting and
    huge numbers mixed in."""
    anything = st.dictionaries(st.sampled_from(keys), JSON_VALUES, max_size=len(keys))
    plausible = st.builds(lambda base, extra: {**extra, **base}, st.fixed_dictionaries(required), anything)
    objects = st.one_of(plausible, anything)
    encoded = st.one_of(
        objects.map(lambda row: json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass")),
        objects.map(lambda row: json.dumps(row).encode("ascii")),  # surrogates as \udXXX escapes
    )
    line = st.one_of(
        encoded,
        st.binary(max_size=200),
        st.sampled_from([b"", b"   ", b"\xff\xfe", b"[" * 5000, b'{"id": ' + b"9" * 5000 + b"}", b"\xe2\x80\xa8"]),
        st.integers(0, 5000).map(lambda n: b'{"id": "a", "question": ' + b"[" * n + b"]" * n + b"}"),
    )
    return st.lists(line, max_size=6).map(b"\n".join)


def write(data: bytes, suffix: str) -> Path:
    handle = tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False)
    with handle:
        handle.write(data)
    return Path(handle.name)


def check_task_file(data: bytes) -> None:
    path = write(data, ".jsonl")
    try:
        for load in (load_tasks, load_tasks_from):
            try:
                tasks = load(path)
            except TaskFileError as err:
                one_line_error(str(err), f"{path}:")
                continue
            for task in tasks:
                assert isinstance(task, Task) and isinstance(task.id, str) and task.id
                assert isinstance(task.question, str) and task.question.strip()
                assert all(isinstance(a, str) for a in task.answers) and isinstance(task.kind, str)
                assert task.context is None or isinstance(task.context, str)
                assert isinstance(task.metadata, dict) and isinstance(task.metadata.get("needs_search", True), bool)
                assert all(isinstance(a, str) for a in task.oracle_actions)
                json.dumps(task.to_dict(), ensure_ascii=False).encode("utf-8")  # writable back as JSONL
    finally:
        path.unlink()


def check_corpus(data: bytes) -> None:
    path = write(data, ".jsonl")
    try:
        docs = load_corpus(path)
    except CorpusError as err:
        one_line_error(str(err), str(path))
        return
    finally:
        path.unlink()
    for doc in docs:
        assert isinstance(doc, Document) and isinstance(doc.id, str) and doc.id.strip()
        assert isinstance(doc.contents, str) and doc.contents.strip() and isinstance(doc.metadata, dict)
        json.dumps([doc.id, doc.contents, doc.metadata], ensure_ascii=False).encode("utf-8")


ANY_BYTES = st.binary(max_size=2000)
SOME_ID = st.one_of(ANY_TEXT, st.integers())
TASK_ROWS = rows(TASK_KEYS, {"id": SOME_ID, "question": ANY_TEXT, "answers": st.lists(ANY_TEXT, max_size=3)})
DOC_ROWS = rows(DOC_KEYS, {"id": SOME_ID, "contents": ANY_TEXT})
test_task_files, test_task_files_deep = fuzz_pair(st.one_of(ANY_BYTES, TASK_ROWS), check_task_file, fast=300)
test_corpora, test_corpora_deep = fuzz_pair(st.one_of(ANY_BYTES, DOC_ROWS), check_corpus, fast=300)
