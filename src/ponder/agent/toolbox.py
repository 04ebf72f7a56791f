"""Built-in tools by name, for `ponder chat` and `ponder run-agent`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BUILTIN_TOOLS = ("calculator", "echo", "python", "read_file", "search", "rag")


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
    """The tools called `names`; ValueError naming what is unknown or missing."""
    from ponder.tools import builtin

    unknown = [n for n in names if n not in BUILTIN_TOOLS]
    if unknown:
        raise ValueError(f"unknown tool {', '.join(unknown)} (built-in tools: {', '.join(BUILTIN_TOOLS)})")
    tools: list[Any] = []
    for name in dict.fromkeys(names):
        if name == "calculator":
            tools.append(builtin.calculator)
        elif name == "echo":
            tools.append(builtin.echo)
        elif name == "python":
            tools.append(builtin.make_python_tool(options.python_timeout_s, options.python_memory_mb))
        elif name == "read_file":
            if not options.files_root:
                raise ValueError("tool read_file needs --files-root DIR (the folder it may read)")
            tools.append(builtin.make_read_file_tool(options.files_root))
        elif name == "search":
            tools.append(_corpus_search(options))
        else:
            tools.append(_rag_search(options))
    return tools


def _corpus_search(options: ToolboxOptions) -> Any:
    from ponder.tools.builtin import make_corpus_search_tool
    from ponder.tools.retrieval import BM25Retriever, load_corpus

    if not options.corpus:
        raise ValueError("tool search needs --corpus FILE.jsonl")
    return make_corpus_search_tool(BM25Retriever(load_corpus(options.corpus)))


def _rag_search(options: ToolboxOptions) -> Any:
    from ponder.agent.rag import RagIndex

    if not options.docs:
        raise ValueError("tool rag needs --docs PATH (files or folders of documents)")
    return RagIndex.from_paths(options.docs).as_tool()
