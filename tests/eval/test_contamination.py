"""The contamination check: normalisation, shingles and overlap by hand on tiny strings;
planted duplicates (exact, paraphrased, numbers renamed) found; unrelated items not."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from ponder.eval.contamination import (
    PLACEHOLDER,
    ContaminationConfig,
    Item,
    best_cosine_matches,
    best_ngram_matches,
    check_contamination,
    containment,
    contamination_table,
    jaccard,
    normalise,
    shingles,
    summary_line,
)
from ponder.eval.contamination_data import minilm_embedder, read_items, row_text

TRAIN = [
    Item("t0", "Mia has 7 pencils and gets 5 more from her teacher after 2 lessons. How many of the 9 pencils "
               "does Mia have now if she gives 3 away to 4 friends at the end of day 6?"),  # fmt: skip
    Item("t1", "The central bank raised interest rates to slow inflation, and markets fell sharply on the news "
               "that evening in every large exchange."),  # fmt: skip
    Item("t2", "Write a Python function that returns the reverse of a string, keeping every character as it "
               "was and handling the empty string."),  # fmt: skip
]


def test_normalise_folds_case_drops_punctuation_and_keeps_signs():
    assert normalise("Twenty-one APPLES, 3.5 kg!  What is 2+3?") == [
        "twenty", "one", "apples", "3.5", "kg", "what", "is", "2", "+", "3"]  # fmt: skip
    # a run of number words counts once, so "twenty-one" and "21" read the same
    assert normalise("Twenty-one apples and 21 pears", numbers=True) == [
        PLACEHOLDER, "apples", "and", PLACEHOLDER, "pears"]  # fmt: skip
    assert normalise("What is 2 + 3?", numbers=True) != normalise("What is 2 * 3?", numbers=True)
    assert normalise("ﬁve Café") == ["five", "café"]  # NFKC: the ligature is two letters


def test_shingles_by_hand():
    assert shingles(["a", "b", "c", "d"], 2) == {("a", "b"), ("b", "c"), ("c", "d")}
    assert shingles(["a", "b", "c", "d"], 4) == {("a", "b", "c", "d")}
    assert shingles(["a", "b"], 5) == {("a", "b")}  # shorter than n: one shingle, itself
    assert shingles([], 3) == set()


def test_jaccard_and_containment_by_hand():
    a = {"ab", "bc", "cd"}
    b = {"bc", "cd", "de", "ef"}
    assert jaccard(a, b) == pytest.approx(2 / 5)
    assert containment(a, b) == pytest.approx(2 / 3)
    assert containment(b, a) == pytest.approx(2 / 4)
    assert jaccard(set(), set()) == 0.0 and containment(set(), b) == 0.0


def test_ngram_match_by_hand():
    # eval trigrams: the cat sat / cat sat on / sat on the / on the mat (4); the train text
    # holds the last three of them among its 5 trigrams: containment 3/4, Jaccard 3/(4+5-3)
    evaluation = [normalise("The cat sat on the mat.")]
    train = [normalise("A dog ran."), normalise("A cat sat on the mat today.")]
    (match,) = best_ngram_matches(evaluation, train, 3, overlap=0.75)
    assert match.train_index == 1
    assert match.score == pytest.approx(0.75) and match.jaccard == pytest.approx(0.5)
    assert match.flagged
    (match,) = best_ngram_matches(evaluation, train, 3, overlap=0.8)
    assert not match.flagged
    (none,) = best_ngram_matches([normalise("Something else entirely")], train, 3, overlap=0.5)
    assert none.train_index == -1 and none.score == 0.0 and not none.flagged


def test_a_short_item_inside_a_longer_training_text_is_found():
    (match,) = best_ngram_matches([normalise("What is 17 + 7?")],
                                  [normalise("Homework: what is 17 + 7? Show your steps.")], 13, 0.5)  # fmt: skip
    assert match.train_index == 0 and match.score == 1.0


def test_a_planted_exact_duplicate_is_found_by_every_ngram_signal():
    evaluation = [Item("e0", TRAIN[1].text.upper())]  # case does not hide it
    report = check_contamination(TRAIN, evaluation)
    (item,) = report.items
    assert item.flagged_by == ["ngram13", "ngram8", "numbers8"]
    assert {match.train_index for match in item.matches.values()} == {1}
    assert all(match.score == 1.0 and match.jaccard == 1.0 for match in item.matches.values())
    assert report.share == 1.0


def test_a_renamed_number_duplicate_is_found_by_the_numbers_signal_only():
    renamed = Item("e0", "Mia has 12 pencils and gets eleven more from her teacher after 3 lessons. How many of "
                         "the 20 pencils does Mia have now if she gives 2 away to 5 friends at the end of day 1?")  # fmt: skip
    (item,) = check_contamination(TRAIN, [renamed]).items
    assert item.flagged_by == ["numbers8"]
    assert item.matches["numbers8"].train_index == 0 and item.matches["numbers8"].score == 1.0
    assert item.matches["ngram13"].score == 0.0  # a number in every 13 words breaks every 13-gram
    (item,) = check_contamination(TRAIN, [renamed], ContaminationConfig(numbers=False)).items
    assert item.flagged_by == []


def test_unrelated_items_are_not_flagged():
    unrelated = [Item("e0", "Name the capital city of the country that hosted the first modern Olympic games."),
                 Item("e1", "Sort a list of integers in descending order and return the three largest values."),
                 Item("e2", "How many legs do four spiders and three ants have together?")]  # fmt: skip
    report = check_contamination(TRAIN, unrelated, ContaminationConfig(embeddings=True), embed=_bag_of_words)
    assert report.flagged == [] and report.share == 0.0
    assert report.by_signal() == {"ngram13": 0, "ngram8": 0, "numbers8": 0, "embedding": 0}


# A stand-in encoder for the mechanism (the MiniLM test below checks the real one):
# bag-of-words vectors over a fixed vocabulary, synonyms mapped to one word.
_SYNONYMS = {"lifted": "raised", "increased": "raised", "tumbled": "fell", "dropped": "fell", "cut": "slow"}


def _bag_of_words(texts: list[str]) -> np.ndarray:
    vocabulary = sorted({_SYNONYMS.get(w, w) for item in TRAIN for w in normalise(item.text)})
    vectors = np.zeros((len(texts), len(vocabulary) + 1))
    for row, text in enumerate(texts):
        for word in normalise(text):
            word = _SYNONYMS.get(word, word)
            vectors[row, vocabulary.index(word) if word in vocabulary else -1] += 1
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


PARAPHRASE = Item("e0", "That evening, on the news that the central bank increased interest rates to cut "
                        "inflation, markets in every large exchange tumbled sharply.")  # fmt: skip


def test_a_paraphrase_is_found_by_the_embedding_signal_not_the_ngrams():
    report = check_contamination(TRAIN, [PARAPHRASE], ContaminationConfig(embeddings=True), embed=_bag_of_words)
    (item,) = report.items
    assert item.flagged_by == ["embedding"]
    assert item.matches["embedding"].train_index == 1 and item.matches["embedding"].score > 0.9


def test_the_paraphrase_with_minilm():
    embed, why = minilm_embedder()
    if embed is None:
        pytest.skip(why)
    report = check_contamination(TRAIN, [PARAPHRASE, Item("e1", "A recipe for lemon cake with poppy seeds.")],
                                 ContaminationConfig(embeddings=True, threshold=0.8), embed=embed)  # fmt: skip
    assert report.items[0].matches["embedding"].train_index == 1
    assert report.items[0].flagged_by == ["embedding"] and report.items[1].flagged_by == []


def test_cosine_matches_by_hand_and_in_chunks():
    train = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    evaluation = np.array([[0.8, 0.6], [0.0, 1.0]])
    # cosines: row 0 → 0.8, 0.96, 0.6; row 1 → 0, 0.8, 1
    matches = best_cosine_matches(evaluation, train, threshold=0.97)
    assert [(m.train_index, round(m.score, 6), m.flagged) for m in matches] == [(1, 0.96, False), (2, 1.0, True)]
    chunked = best_cosine_matches(evaluation, train, threshold=0.97, chunk=1)
    assert [(m.train_index, m.score) for m in chunked] == [(m.train_index, m.score) for m in matches]
    tie = best_cosine_matches(np.array([[1.0, 0.0]]), np.array([[1.0, 0.0], [1.0, 0.0]]), 0.9, chunk=1)
    assert tie[0].train_index == 0  # a tie keeps the first


def test_without_an_encoder_the_embedding_signal_is_left_out_with_a_reason():
    report = check_contamination(TRAIN, [PARAPHRASE], ContaminationConfig(embeddings=True), skipped="embedding "
                                 "skipped: needs ponder[retrieval]")  # fmt: skip
    assert report.signals == ["ngram13", "ngram8", "numbers8"]
    assert summary_line(report).endswith("(ngram13 0, ngram8 0, numbers8 0; embedding skipped: needs ponder[retrieval])")


def test_the_encoder_falls_back_in_one_line(monkeypatch):
    import ponder.tools.retrieval.dense as dense
    from ponder.extras import MissingExtra

    def missing(device=None):
        raise MissingExtra("dense retrieval needs ponder[retrieval]: pip install 'ponder[retrieval]'")

    monkeypatch.setattr(dense, "load_encoder", missing)
    embed, why = minilm_embedder()
    assert embed is None and why == "embedding skipped: dense retrieval needs ponder[retrieval]: pip install " \
                                    "'ponder[retrieval]'"


def test_the_report_names_items_and_scores_and_fits_80_columns():
    evaluation = [Item("e-copy", TRAIN[0].text), Item("e-clean", "Completely different words here.")]
    report = check_contamination(TRAIN, evaluation)
    data = report.to_dict()
    assert data["summary"]["flagged"] == 1 and data["summary"]["share"] == 0.5
    first = data["items"][0]
    assert first["flagged_by"] == ["ngram13", "ngram8", "numbers8"]
    assert first["matches"]["ngram13"]["train_id"] == "t0" and first["matches"]["ngram13"]["score"] == 1.0
    assert data["items"][1]["matches"]["ngram8"]["train_id"] is None
    json.dumps(data, allow_nan=False)
    buffer = io.StringIO()
    Console(file=buffer, width=80).print(contamination_table(report))
    text = buffer.getvalue()
    assert "e-copy" in text and "t0" in text and "e-clean" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert summary_line(report).startswith("contamination: 1 of 2 eval items (50.0%) match the 3 train items")


def test_config_is_checked():
    with pytest.raises(ValueError, match="overlap"):
        ContaminationConfig(overlap=0)
    with pytest.raises(ValueError, match="ngram"):
        ContaminationConfig(ngram=0)
    assert ContaminationConfig(ngram=8, short_ngram=8).signals() == ["ngram8", "numbers8"]
    assert ContaminationConfig(short_ngram=0, numbers=True).signals() == ["ngram13", "numbers13"]


def test_row_text_reads_every_layout():
    assert row_text({"id": "q", "question": "Who?", "context": "Paris is big."}) == "Who?\nParis is big."
    conversation = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello"}]}  # fmt: skip
    assert row_text(conversation) == "Be brief.\nHi\nHello"
    pair = {"prompt": [{"role": "user", "content": "Q"}], "chosen": [{"role": "assistant", "content": "A"}],
            "rejected": [{"role": "assistant", "content": "B"}]}  # fmt: skip
    assert row_text(pair) == "Q\nA\nB"
    trajectory = {"task_id": "t", "turns": [{"action": "<search>x</search>", "observation": "doc"},
                                            {"action": "<answer>y</answer>", "observation": None}]}  # fmt: skip
    assert row_text(trajectory) == "<search>x</search>\ndoc\n<answer>y</answer>"
    assert row_text({"text": "plain"}) == "plain"
    assert row_text({"problem": "2+2?", "solution": "4", "level": 1}) == "2+2?\n4"


def test_read_items_from_files(tmp_path):
    from ponder.envs.taskfile import write_jsonl
    from ponder.types import Trajectory, Turn, save_trajectories

    tasks = tmp_path / "tasks.jsonl"
    write_jsonl(tasks, [{"id": "a", "question": "Q one?", "answers": ["x"]}, {"question": "Q two?"}])
    assert [(i.id, i.text) for i in read_items(tasks, "eval")] == [("a", "Q one?"), ("tasks:1", "Q two?")]
    episodes = tmp_path / "episodes.parquet"
    save_trajectories([Trajectory("t1", [1], turns=[Turn(0, "<answer>Paris</answer>")])], episodes)
    assert [(i.id, i.text) for i in read_items(episodes, "train")] == [("t1", "<answer>Paris</answer>")]
    with pytest.raises(ValueError, match="role"):
        read_items(tasks, "test")
