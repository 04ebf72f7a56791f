"""Answer extraction and comparison (ponder.rewards.verify): every extractor on a right,
a wrong, a malformed and an other-format answer; every comparator on hand-picked
pairs; the chain and the gold extraction; the `correct` and `extracted` rewards."""

from __future__ import annotations

import pytest

from ponder.rewards.verify import (
    COMPARATORS,
    EXTRACTORS,
    AnswerFound,
    VerifiedAnswer,
    VerifyOptions,
    extract,
    is_match,
    resolve,
)
from ponder.types import Task, Trajectory, Turn

OPTIONS = VerifyOptions(pattern=r"ANSWER:\s*(?P<answer>\S+)", field="result.value")
GOLD = "42"

# extractor -> (right, wrong, malformed, other format): what each reply gives, and the reply
CASES = {
    "boxed": [("So \\boxed{42}.", "42"), ("So \\boxed{41}.", "41"), ("So \\boxed{42", None), ("#### 42", None)],
    "gsm8k": [("6 * 7 = 42\n#### 42", "42"), ("#### 41", "41"), ("####\n", None), ("\\boxed{42}", None)],
    "answer_is": [("The answer is 42.", "42"), ("The answer is: 41 apples.", "41"), ("The answer is", None),
                  ("<answer>42</answer>", None)],  # fmt: skip
    "answer_tag": [("<answer>42</answer>", "42"), ("<answer> 41 </answer>", "41"), ("<answer>42", None),
                   ("The answer is 42.", None)],  # fmt: skip
    "last_number": [("7 + 35 = 42", "42"), ("it is 41", "41"), ("no number here", None), ("forty-two", None)],
    "regex": [("ANSWER: 42", "42"), ("ANSWER: 41", "41"), ("ANSWER:", None), ("answer = 42", None)],
    "json": [('{"result": {"value": 42}}', "42"), ('ok {"result": {"value": "41"}}', "41"),
             ('{"result": {"value": 42', None), ('{"answer": 42}', None)],  # fmt: skip
    "whole": [(" 42 ", "42"), ("41", "41"), ("   ", None), ("\\boxed{42}", "\\boxed{42}")],
}


def test_every_registered_extractor_is_tested():
    assert sorted(CASES) == EXTRACTORS.names()


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_extractor_on_right_wrong_malformed_and_other_format(name):
    extractor = EXTRACTORS.get(name)
    results = [extractor(text, OPTIONS) for text, _ in CASES[name]]
    assert results == [expected for _, expected in CASES[name]]
    right, wrong, malformed, other = results
    assert is_match(right, [GOLD], OPTIONS)
    assert not is_match(wrong, [GOLD], OPTIONS) and not is_match(malformed, [GOLD], OPTIONS)


def test_the_extractors_read_what_people_write():
    assert EXTRACTORS.get("boxed")("\\boxed{\\frac{3}{4}} and \\boxed{12}", OPTIONS) == "12"  # the last one
    assert EXTRACTORS.get("boxed")("\\boxed{\\frac{3}{4}}", OPTIONS) == "\\frac{3}{4}"  # braces balanced
    assert EXTRACTORS.get("gsm8k")("#### 1,000\nmore text", OPTIONS) == "1,000"
    assert EXTRACTORS.get("gsm8k")("#### $18.", OPTIONS) == "18"
    assert EXTRACTORS.get("answer_is")("I think the answer is Paris. Or not.", OPTIONS) == "Paris"
    assert EXTRACTORS.get("answer_is")("The answer is 3.5 cups", OPTIONS) == "3.5"
    assert EXTRACTORS.get("last_number")("half: 0.75", OPTIONS) == "3/4"
    assert EXTRACTORS.get("regex")("x=4 then x=9", VerifyOptions(pattern=r"x=(\d+)")) == "9"
    assert EXTRACTORS.get("regex")("x=4", VerifyOptions(pattern=r"x=\d+")) == "x=4"
    assert EXTRACTORS.get("json")('{"answer": 2.5} {"answer": "late"}', VerifyOptions()) == "late"


COMPARE = {  # comparator -> [(predicted, gold, match)]
    "exact": [("42", "42", True), (" Paris ", "Paris", True), ("paris", "Paris", False), ("42.0", "42", False)],
    "numeric": [("1,000", "1000", True), ("$12.50", "12.5", True), ("3/4", "0.75", True), ("\\frac{3}{4}", "0.75", True),
                ("42.0000001", "42", True), ("42.01", "42", False), ("Paris", "Paris", False)],  # fmt: skip
    "normalized": [("The Eiffel Tower.", "eiffel tower", True), ("Paris", "Rome", False), ("1,000", "1000", True)],
    "auto": [("1,000", "1000", True), ("0.5", "1/2", True), ("An apple", "apple", True), ("41", "42", False)],
}


def test_every_registered_comparator_is_tested():
    assert sorted(COMPARE) == COMPARATORS.names()


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_each_comparator_on_hand_picked_pairs(name):
    compare = COMPARATORS.get(name)
    assert [compare(p, g, VerifyOptions()) for p, g, _ in COMPARE[name]] == [m for _, _, m in COMPARE[name]]


def test_numeric_tolerance_is_relative_to_the_gold():
    loose, exact = VerifyOptions(tolerance=0.01), VerifyOptions(tolerance=0)
    assert COMPARATORS.get("numeric")("1005", "1000", loose) and not COMPARATORS.get("numeric")("1011", "1000", loose)
    assert COMPARATORS.get("numeric")("0.005", "0", loose)  # max(1, |gold|): an absolute floor near zero
    assert not COMPARATORS.get("numeric")("42.0000001", "42", exact)


def test_the_chain_takes_the_first_answer_found_and_golds_are_extracted_too():
    options = VerifyOptions(extract=("boxed", "gsm8k", "last_number"), gold_extract=("gsm8k",))
    assert extract("#### 7 then \\boxed{9}", options.extract, options) == "9"
    assert extract("#### 7 then 9", options.extract, options) == "7"
    assert extract("none", options.extract, options) is None
    assert is_match("12", ["Mia has 7 + 5 = 12.\n#### 12"], options)
    assert not is_match("12", ["a solution without its final line"], options)


def test_a_user_function_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_verify.py").write_text(
        "def first_word(text, options):\n    return text.split()[0] if text.split() else None\n\n"
        "def same_length(predicted, gold, options):\n    return len(predicted) == len(gold)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    options = VerifyOptions(extract=("my_verify:first_word",), compare="my_verify:same_length")
    assert extract("abc def", options.extract, options) == "abc"
    assert is_match("abc", ["xyz"], options) and not is_match("abcd", ["xyz"], options)
    with pytest.raises(ValueError, match="env.options.extract: unknown answer extractor 'boxd'; valid: answer_is"):
        resolve(EXTRACTORS, "boxd", "env.options.extract")


def _reply(text: str) -> Trajectory:
    return Trajectory("t", [1], [2], [1], [0.0], turns=[Turn(0, text)])


def test_the_rewards_score_the_reply():
    task = Task("t", "6 * 7?", ["42"])
    correct, extracted = VerifiedAnswer(), AnswerFound()
    assert [correct(_reply(text), task) for text in ("\\boxed{42}", "#### 41", "no idea")] == [1.0, 0.0, 0.0]
    assert [extracted(_reply(text), task) for text in ("\\boxed{42}", "#### 41", "no idea")] == [1.0, 1.0, 0.0]
    assert correct(_reply("\\boxed{42}"), Task("u", "open question?", [])) is None  # no gold: unscorable
