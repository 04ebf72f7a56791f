"""TRL-style rows: parsing, bad-row counts, one-line errors, JSONL / Parquet / datasets."""

import json

import pytest

from ponder.data import DataError, load_conversations, load_preferences, read_rows, write_jsonl

TOOLS = [{"type": "function", "function": {"name": "search", "description": "look up", "parameters": {}}}]
GOOD = {
    "messages": [
        {"role": "user", "content": "Where was Ann born?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "Ann"}}}]},
        {"role": "tool", "content": "Ann was born in Oslo."},
        {"role": "assistant", "content": "Oslo"},
    ],
    "tools": TOOLS,
    "task_type": "tool_selection",
}  # fmt: skip


def test_bad_rows_are_skipped_and_counted_by_reason():
    no_assistant = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    undeclared = json.loads(json.dumps(GOOD))
    undeclared["messages"][1]["tool_calls"][0]["function"]["name"] = "calculator"
    conversations, report = load_conversations([GOOD, no_assistant, undeclared, "text"])
    assert [c.task_type for c in conversations] == ["tool_selection"]
    assert report.to_dict() == {
        "read": 4, "kept": 1,
        "skipped": {"no assistant turn": 1, "undeclared tool": 1, "not a mapping": 1},
    }  # fmt: skip


def test_nothing_usable_is_one_clear_error():
    with pytest.raises(DataError, match="no usable sft example among 1 rows \\(1 no assistant turn\\)"):
        load_conversations([{"messages": [{"role": "user", "content": "hi"}]}])


def test_preference_rows_standard_and_conversational_and_identical_pairs():
    rows = [
        {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}],
         "rejected": [{"role": "assistant", "content": "hello"}]},
    ]  # fmt: skip
    pairs, report = load_preferences(rows)
    assert pairs[0].prompt == [{"role": "user", "content": "2+2?"}]
    assert pairs[0].chosen == [{"role": "assistant", "content": "4"}]
    assert report.skipped == {"identical chosen and rejected": 1}


def test_jsonl_parquet_and_datasets_round_trip(tmp_path):
    conversations, _ = load_conversations([GOOD, GOOD])
    write_jsonl(tmp_path / "sft.jsonl", conversations)
    from_jsonl, _ = load_conversations(tmp_path / "sft.jsonl")
    assert from_jsonl[0].messages == GOOD["messages"]

    import datasets

    rows = [dict(GOOD, tools=json.dumps(TOOLS))] * 2  # Parquet exports often keep tools as JSON text
    dataset = datasets.Dataset.from_list(rows)
    dataset.to_parquet(str(tmp_path / "sft.parquet"))
    dataset.save_to_disk(str(tmp_path / "saved"))
    for source in (tmp_path / "sft.parquet", tmp_path / "saved", dataset):
        loaded, report = load_conversations(source)
        assert report.kept == 2 and loaded[0].tools == TOOLS
        assert loaded[0].messages[1]["tool_calls"][0]["function"]["arguments"] == {"query": "Ann"}


def test_unknown_file_kinds_fail_with_one_line(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown data format"):
        read_rows(tmp_path / "x.csv")
    with pytest.raises(DataError, match="no such data file"):
        read_rows(tmp_path / "missing.jsonl")


def test_a_broken_json_line_names_its_line_and_an_invalid_tool_schema_is_not_trained_on(tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(good) + '\n{"messages": [\n')
    with pytest.raises(DataError, match=r"broken.jsonl:2: invalid JSON \(Expecting value at column 15\)"):
        load_conversations(broken)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
    rows = [good, {**good, "tools": [tool]}]
    conversations, report = load_conversations(rows)
    assert len(conversations) == 1 and report.skipped == {"invalid tool schema": 1}
