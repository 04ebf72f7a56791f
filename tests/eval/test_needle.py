"""Needle in a haystack: the documents are built as specified (length, depth, one
needle), scoring is exact match, and `ponder needle` runs end to end on the tiny model
with a RoPE method and a short long-context fine-tune."""

from __future__ import annotations

import json

import pytest

from ponder.cli import main
from ponder.eval.needle import answer_matches, build_case, parse_lengths
from ponder.models.tiny import tiny_tokenizer


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_needle_sits_at_its_depth_of_a_document_of_the_asked_length(depth):
    tokenizer = tiny_tokenizer()
    case = build_case(tokenizer, 2000, depth, seed=3)
    assert 2000 <= len(case.prompt_ids) <= 2000 + 64  # at most one filler sentence (<= 64 tiny tokens) over
    text = tokenizer.decode(case.prompt_ids)
    assert text.count("secret code") == 2  # the needle and the question
    assert f"The secret code of {case.name} is {case.code}." in text
    assert text.index("Answer with the number only.") > text.index(f"is {case.code}.")
    position = case.needle_at / len(case.prompt_ids)
    assert abs(position - depth) < 0.06, position
    assert build_case(tokenizer, 2000, depth, seed=3).prompt_ids == case.prompt_ids  # seeded


def test_exact_match_on_the_first_number():
    assert answer_matches("The secret code of Jun is 40213.", "40213")
    assert answer_matches(" 40,213", "40213")
    assert not answer_matches("It is 4021 or 40213", "40213")
    assert not answer_matches("I do not know", "40213")


def test_lengths_are_token_counts_or_multiples_of_the_trained_length():
    assert parse_lengths("1x,2x,4x", 8192) == [8192, 16384, 32768]
    assert parse_lengths("512, 0.5x", 8192) == [512, 4096]
    with pytest.raises(ValueError, match="--lengths: 'long'"):
        parse_lengths("long", 8192)


def test_ponder_needle_runs_before_and_after_a_long_finetune(tmp_path, capsys):
    out = tmp_path / "needle.json"
    argv = ["needle", "--model", "tiny", "--rope", "yarn", "--factor", "2", "--lengths", "96,192",
            "--depths", "0,100", "--finetune-steps", "3", "--finetune-length", "192", "--finetune-lr", "1e-3",
            "--save-adapter", str(tmp_path / "adapter"), "--out", str(out), "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["rope"]["rope_type"] == "yarn" and result["rope"]["factor"] == 2.0
    assert result["trained_length"] == 4096  # the tiny model's max_position_embeddings
    for stage in ("before", "after"):
        assert [(r["length"], r["depth"]) for r in result[stage]] == [(96, 0.0), (96, 1.0), (192, 0.0), (192, 1.0)]
        assert all(isinstance(r["correct"], bool) for r in result[stage])
    losses = result["finetune"]["losses"]
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert "before     96 tokens" in capsys.readouterr().out


def test_bad_needle_arguments_exit_2(capsys):
    assert main(["needle", "--model", "tiny", "--lengths", "huge", "--device", "cpu"]) == 2
    assert "--lengths" in capsys.readouterr().err
    assert main(["needle", "--model", "tiny", "--depths", "0,150", "--lengths", "64", "--device", "cpu"]) == 2
    assert "--depths" in capsys.readouterr().err
