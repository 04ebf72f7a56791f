"""Built-in tools by name, for `ponder chat` and `ponder run-agent`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ponder.registry import Registry

#: name -> builder(options) -> tool (a ponder Tool), for `--tools NAME,…`
BUILTIN_TOOLS: Registry[Callable[[ToolboxOptions], Any]] = Registry("built-in tool")


@dataclass
class ToolboxOptions:
    """Settings the named tools need.

    files_root: the folder `read_file` may read.
    corpus: a JSONL corpus (`{"id", "contents"}` per line) for `search` (BM25).
    docs: files or folders of documents (text, Markdown, PDF, CSV, images) for `rag`.
    python_timeout_s / python_memory_mb: limits of the `python` sandbox.
    """

    files_root: str | None = None
    corpus: str | None = None
    docs: list[str] | None = None
    python_timeout_s: float = 5.0
    python_memory_mb: int = 256


def build_tools(names: list[str], options: ToolboxOptions) -> list[Any]:
    """The tools called `names` (each once, in order); ValueError naming the first
    unknown one (before any is built) or a missing option."""
    for name in names:
        BUILTIN_TOOLS.check(name)
    return [BUILTIN_TOOLS.get(name)(options) for name in dict.fromkeys(names)]


@BUILTIN_TOOLS.register("calculator")
def _calculator(options: ToolboxOptions) -> Any:
    from ponder.tools.builtin import calculator

    return calculator


@BUILTIN_TOOLS.register("echo")
def _echo(options: ToolboxOptions) -> Any:
    from ponder.tools.builtin import echo

    return echo


@BUILTIN_TOOLS.register("python")
def _python(options: ToolboxOptions) -> Any:
    from ponder.tools.builtin import make_python_tool

    return make_python_tool(options.python_timeout_s, options.python_memory_mb)


@BUILTIN_TOOLS.register("read_file")
def _read_file(options: ToolboxOptions) -> Any:
    from ponder.tools.builtin import make_read_file_tool

    if not options.files_root:
        raise ValueError("tool read_file needs --files-root DIR (the folder it may read)")
    return make_read_file_tool(options.files_root)


@BUILTIN_TOOLS.register("search")
def _corpus_search(options: ToolboxOptions) -> Any:
    from ponder.tools.builtin import make_corpus_search_tool
    from ponder.tools.retrieval import BM25Retriever, load_corpus

    if not options.corpus:
        raise ValueError("tool search needs --corpus FILE.jsonl")
    return make_corpus_search_tool(BM25Retriever(load_corpus(options.corpus)))


@BUILTIN_TOOLS.register("rag")
def _rag_search(options: ToolboxOptions) -> Any:
    from ponder.agent.rag import RagIndex

    if not options.docs:
        raise ValueError("tool rag needs --docs PATH (files or folders of documents)")
    return RagIndex.from_paths(options.docs).as_tool()
