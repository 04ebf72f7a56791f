import os
import time

import pytest

from ponder.tools import ToolRegistry
from ponder.tools.builtin import (
    CalculatorError,
    calculator,
    echo,
    evaluate_expression,
    make_corpus_search_tool,
    make_python_tool,
    make_read_file_tool,
)
from ponder.tools.retrieval import BM25Retriever, Document
from ponder.types import ToolCall


@pytest.mark.parametrize(
    "expression, value",
    [("2 * (3 + 4) ** 2", 98), ("7 // 2 + 7 % 2", 4), ("-3 + +1", -2), ("sqrt(16) + floor(2.7)", 6.0),
     ("max(1, 5, 3) / 2", 2.5), ("2 ** 10", 1024), ("round(pi, 2)", 3.14)],
)
def test_calculator_values(expression, value):
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os').system('ls')", "is not allowed"),
        ("open('/etc/passwd')", "is not allowed"),
        ("(1).__class__", "is not allowed"),
        ("[x for x in range(9)]", "is not allowed"),
        ("'a' * 3", "is not allowed"),
        ("9 ** 9 ** 9", "larger than 1000"),
        ("(10 ** 900) ** 900", "result too large"),
        ("1 / 0", "division by zero"),
        ("10.0 ** 999", "result too large"),
        ("sqrt(-1)", "sqrt: math domain error"),
        ("factorial(100000)", "larger than 500"),
        ("2 +", "not an arithmetic expression"),
        ("1" * 600, "longer than 500"),
    ],
)
def test_calculator_refuses(expression, message):
    started = time.monotonic()
    with pytest.raises(CalculatorError, match=message):
        evaluate_expression(expression)
    assert time.monotonic() - started < 1


def test_calculator_and_echo_as_tools():
    registry = ToolRegistry([calculator, echo])
    assert registry.call(ToolCall("calculator", {"expression": "6 * 7"})).content == "42"
    assert registry.call(ToolCall("calculator", {"expression": "1 / 4"})).content == "0.25"
    bad = registry.call(ToolCall("calculator", {"expression": "import os"}))
    assert bad.is_error and bad.content.startswith("calculator raised CalculatorError: not an arithmetic")
    assert registry.call(ToolCall("echo", {"text": "héllo"})).content == "héllo"


def test_python_tool_runs_code_in_another_process():
    registry = ToolRegistry([make_python_tool(timeout_s=5)])
    result = registry.call(ToolCall("python", {"code": "import os\nprint(os.getpid() != %d, 6 * 7)" % os.getpid()}))
    assert result.content == "exit code 0\nstdout:\nTrue 42\n"


def test_python_tool_infinite_loop_is_killed():
    registry = ToolRegistry([make_python_tool(timeout_s=1)])
    started = time.monotonic()
    result = registry.call(ToolCall("python", {"code": "while True:\n    pass"}))
    assert time.monotonic() - started < 4
    assert result.content.startswith("killed: the code ran past its time limit")


def test_python_tool_memory_bomb_fails_inside_the_child():
    registry = ToolRegistry([make_python_tool(timeout_s=5, memory_mb=128)])
    result = registry.call(ToolCall("python", {"code": "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))"}))
    assert result.content.startswith("exit code 1") and "MemoryError" in result.content


def test_read_file_stays_inside_its_folder(tmp_path):
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    (allowed / "sub" / "notes.txt").write_text("the key is 42")
    (tmp_path / "secret.txt").write_text("do not read")
    (allowed / "link.txt").symlink_to(tmp_path / "secret.txt")
    registry = ToolRegistry([make_read_file_tool(allowed, max_bytes=5)])
    read = lambda path: registry.call(ToolCall("read_file", {"path": path}))  # noqa: E731
    assert read("sub/notes.txt").content == "the k\n…[cut at 5 bytes]"
    for forbidden in ["../secret.txt", str(tmp_path / "secret.txt"), "link.txt", "/etc/passwd"]:
        result = read(forbidden)
        assert result.is_error and "outside the allowed folder" in result.content, forbidden
    assert "is not a file" in read("missing.txt").content


def test_corpus_search_tool():
    docs = [Document("owl", "Owls\nOwls hunt at night."), Document("bee", "Bees\nBees make honey.")]
    registry = ToolRegistry([make_corpus_search_tool(BM25Retriever(docs), topk=1)])
    assert registry.call(ToolCall("search", {"query": "honey"})).content == "Doc 1 (Title: Bees) Bees make honey."
    assert registry.call(ToolCall("search", {"query": "zebra"})).content == "no results"
