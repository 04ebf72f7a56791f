"""`ponder contamination TRAIN EVAL`: the table at 80 columns, --json, --out, a
recipe's own splits, and bad input as one line with exit code 2."""

from __future__ import annotations

import json

from ponder.cli import main
from ponder.envs.taskfile import write_jsonl

LEAK = "Which river flows through the capital city of the country where the oldest university in Europe stands?"


def _files(tmp_path):
    train, evaluation = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    write_jsonl(train, [{"messages": [{"role": "user", "content": LEAK}, {"role": "assistant", "content": "x"}]},
                        {"messages": [{"role": "user", "content": "Write a haiku about autumn leaves."}]}])  # fmt: skip
    write_jsonl(evaluation, [{"id": "leaked", "question": LEAK.upper(), "answers": ["Reno"]},
                             {"id": "clean", "question": "How many moons does Mars have?", "answers": ["2"]}])  # fmt: skip
    return train, evaluation


def test_the_table_names_the_leaked_item_within_80_columns(tmp_path, capsys):
    train, evaluation = _files(tmp_path)
    out = tmp_path / "report.json"
    assert main(["contamination", str(train), str(evaluation), "--no-embeddings", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "leaked" in captured.out and "train:0" in captured.out and "clean" not in captured.out
    assert all(len(line) <= 80 for line in captured.out.splitlines())
    assert captured.err.startswith("contamination: 1 of 2 eval items (50.0%) match the 2 train items")
    report = json.loads(out.read_text())
    assert report["items"][0]["flagged_by"] == ["ngram13", "ngram8", "numbers8"]
    # all 5 of the question's 13-grams are in the conversation, which has one more (its reply "x")
    assert report["items"][0]["matches"]["ngram13"] == {"train_index": 0, "train_id": "train:0", "score": 1.0,
                                                        "jaccard": 5 / 6, "flagged": True}  # fmt: skip


def test_json_and_thresholds(tmp_path, capsys):
    train, evaluation = _files(tmp_path)
    assert main(["contamination", str(train), str(evaluation), "--json", "--no-embeddings", "--ngram", "5",
                 "--short-ngram", "0", "--no-numbers"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["summary"]["signals"] == ["ngram5"] and report["summary"]["flagged"] == 1
    assert report["config"]["ngram"] == 5


def test_a_recipe_names_its_own_splits(tmp_path, capsys):
    overrides = ["env.options.taskgen.n_people=20", "env.options.taskgen.n_train=12", "env.options.taskgen.n_eval=4"]
    assert main(["contamination", "recipes/search_qa.yaml", "recipes/search_qa.yaml", "--no-embeddings",
                 *overrides]) == 0  # fmt: skip
    assert "contamination: 0 of 4 eval items (0.0%) match the 12 train items" in capsys.readouterr().err


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    train, _ = _files(tmp_path)
    assert main(["contamination", str(train), str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ponder contamination: error: ") and "nope.jsonl" in err[0]
