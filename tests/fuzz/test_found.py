"""Every failure the fuzzers (and the issue) found, as a plain regression test."""

import contextlib
import io
import json
import shutil
import time

import pytest

from ponder.config import ConfigError, load_recipe
from ponder.envs.taskfile import TaskFileError, load_tasks
from ponder.tools.parsers import HermesParser, ReActParser, SearchR1Parser
from ponder.tools.retrieval.corpus import CorpusError, load_corpus
from ponder.train.checkpoint import damage

from .test_fuzz_checkpoint import damaged_copy


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>", "invalid JSON in <tool_call>: nested too deeply"),
        ('<tool_call>{"name": "x", "arguments": {"a": ' + "1" * 5000 + "}}</tool_call>",
         "invalid JSON in <tool_call>: Exceeds the limit (4300 digits) for integer string conversion"),
        ('<tool_call>{"name": "x", "arguments": "' + "[" * 5000 + '"}</tool_call>', "arguments of 'x' are a string"),
        ('<tool_call>{"name": "x", "arguments": ' + "[" * 40 + "]" * 40 + "}</tool_call>",
         "invalid JSON in <tool_call>: nested deeper than 32 levels"),
    ],
)  # fmt: skip
def test_hermes_deep_or_huge_json_is_a_parse_error(text, error):
    assert HermesParser().parse(text).error.startswith(error)


def test_react_deep_json_and_huge_integers_are_parse_errors():
    parser = ReActParser()
    deep = parser.parse("Action: search\nAction Input: " + '{"a":' * 5000)
    assert deep.error.startswith("invalid JSON in Action Input: nested too deeply")
    huge = parser.parse('Action: search\nAction Input: {"a": ' + "1" * 5000 + "}")
    assert huge.error.startswith("invalid JSON in Action Input: Exceeds the limit")


def test_lone_surrogates_in_calls_become_replacement_characters():
    calculator = SearchR1Parser(tool_name="calculator", argument="expression", call_tag="calculator")
    (call,) = calculator.parse("<calculator>\ud800</calculator>").calls
    assert call.arguments == {"expression": "\ufffd"}
    (call,) = HermesParser().parse('<tool_call>{"name": "s\\ud800", "arguments": {"q\\udc00": "\\udfff"}}</tool_call>').calls
    assert (call.name, call.arguments) == ("s\ufffd", {"q\ufffd": "\ufffd"})


def test_search_r1_think_scan_is_linear():
    started = time.monotonic()
    result = SearchR1Parser().parse("<think>" * 20_000 + "<answer>x</answer>")
    assert time.monotonic() - started < 0.5  # the regex took 13 s
    assert result.answer == "x"


def _file(tmp_path, data: bytes):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "data, message",
    [
        (b'{"id": "a", "question": "q", "answers": ["x"]}\n\x80', ":2: not valid UTF-8 (invalid start byte at byte 0)"),
        (b"[" * 5000, ":1: not valid JSON (nested too deeply)"),
        (b'{"id": ' + b"9" * 5000 + b"}", ":1: not valid JSON (Exceeds the limit (4300 digits) for integer string conversion)"),
        (b'{"id": "a", "question": "q\\ud800", "answers": ["x"]}', ":1: task 'a' holds a lone surrogate"),
        (b'{"id": "a", "question": "q", "answers": ["x"], "kind": 5}', ":1: task 'a': 'kind' must be str, got int"),
        (b'{"id": "a", "question": "q", "answers": ["x"], "needs_search": "no"}', "'needs_search' must be bool"),
    ],
)  # fmt: skip
def test_bad_task_files_are_one_line_errors_naming_file_and_line(tmp_path, data, message):
    path = _file(tmp_path, data)
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value) and "\n" not in str(info.value)


def test_a_task_line_holding_u2028_is_one_line(tmp_path):
    row = {"id": "a", "question": "one\u2028line", "answers": ["x"]}
    path = _file(tmp_path, json.dumps(row, ensure_ascii=False).encode("utf-8"))
    assert load_tasks(path)[0].question == "one\u2028line"  # str.splitlines cut it in two


@pytest.mark.parametrize(
    "data, message",
    [
        (b'{"id": 0, "contents": "\\ud800"}', ":1: document '0' holds a lone surrogate"),
        (b"[" * 5000, ":1: not valid JSON (nested too deeply)"),
        (b'{"id": ' + b"9" * 5000 + b"}", ":1: not valid JSON (Exceeds the limit"),
    ],
)
def test_bad_corpora_are_one_line_errors(tmp_path, data, message):
    path = _file(tmp_path, data)
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        ("[" * 1074, [], "YAML nested deeper than 64 levels"),
        ("{}\n", ["model=!!float "], "(override): 'model=!!float ': not valid YAML (IndexError"),
        ("{}\n", ["\n"], r"(override): '\n' is not key=value"),
        ("{}\n", ["train.steps=[unclosed"], "'train.steps=[unclosed': not valid YAML"),
        ("style: nope\n", [], "style 'nope' is unknown"),
    ],
)
def test_bad_recipes_are_one_line_config_errors(tmp_path, text, overrides, message):
    from ponder.agent.config import AgentConfig

    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    cls = AgentConfig if text.startswith("style") else None
    with pytest.raises(ConfigError) as info:
        load_recipe(path, overrides, cls=cls) if cls else load_recipe(path, overrides)
    assert str(info.value).startswith(str(path)) and message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "replacement, why",
    [
        (b"[]", "checksums.json is not a mapping of file names to sha256 digests"),
        (b'{"a\\nb": "0"}', "checksums.json lists 'a\\nb', not a file name"),
        (b"{}", "'adapter_config.json' is not in checksums.json"),
    ],
)
def test_a_rewritten_checksums_file_marks_the_checkpoint_damaged(replacement, why):
    run = damaged_copy([("checkpoints/step-000002/checksums.json", "replace", 0, replacement)])
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            assert damage(run / "checkpoints" / "step-000002") == why
    finally:
        shutil.rmtree(run)
