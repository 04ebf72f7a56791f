"""Feedback -> preference pairs, on hand-built rows whose pairs are worked out by hand."""

from __future__ import annotations

from collections import Counter

from ponder.personal.feedback import PreferencePair, preference_pairs, rating
from ponder.personal.store import Feedback, Interaction

Q1 = [{"role": "user", "content": "Capital of France?"}]
Q2 = [{"role": "user", "content": "2 + 2?"}]


def chat(interaction_id, messages, response):
    return Interaction(interaction_id, "alice", 0.0, messages, response, None)


def row(row_id, interaction_id, kind, value=None, text=None):
    return Feedback(row_id, interaction_id, "alice", 0.0, kind, value, text)


def test_ratings_take_the_latest_row_and_outcomes_split_at_one_half():
    assert rating([]) == 0
    assert rating([row(1, "a", "up", 1.0), row(2, "a", "down", -1.0)]) == -1
    assert rating([row(5, "a", "up", 1.0), row(2, "a", "down", -1.0)]) == 1  # by id, not list order
    assert rating([row(1, "a", "outcome", 0.5)]) == 1 and rating([row(1, "a", "outcome", 0.49)]) == -1
    assert rating([row(1, "a", "rewrite", text="x")]) == 0  # a rewrite is no rating


def test_pairs_by_hand():
    interactions = [
        chat("a", Q1, "Lyon."),           # down + rewrite           -> (Paris., Lyon.) rewrite
        chat("b", Q1, "Paris."),          # up                       -> (Paris., Lyon.) rating, (Paris., Nice.) rating
        chat("c", Q1, "Nice."),           # outcome 0.0 = down
        chat("d", Q2, "5"),               # down, no alternative     -> counted, no pair
        chat("e", Q2, "4"),               # correction = response    -> same text, dropped
        chat("f", Q2, "22"),              # correction               -> (4, 22) correction
    ]  # fmt: skip
    feedback = [
        row(1, "a", "down", -1.0), row(2, "a", "rewrite", text="Paris."), row(3, "b", "up", 1.0),
        row(4, "c", "outcome", 0.0), row(5, "d", "down", -1.0), row(6, "e", "correction", text="4"),
        row(7, "f", "correction", text="4"),
    ]  # fmt: skip
    pairs, report = preference_pairs(interactions, feedback)
    assert pairs == [
        PreferencePair(Q1, "Paris.", "Lyon.", "rewrite"),
        PreferencePair(Q2, "4", "22", "correction"),
        PreferencePair(Q1, "Paris.", "Nice.", "rating"),
    ]
    # (Paris., Lyon.) is found twice (rewrite, then rating) and kept once
    assert report == Counter({"pairs from rewrite": 1, "pairs from correction": 1, "pairs from rating": 1,
                              "duplicate pair": 1, "same text on both sides": 1,
                              "down without alternative": 1})  # fmt: skip


def test_an_up_and_a_down_on_different_prompts_make_no_pair():
    pairs, report = preference_pairs(
        [chat("a", Q1, "Paris."), chat("b", Q2, "5")], [row(1, "a", "up", 1.0), row(2, "b", "down", -1.0)]
    )
    assert pairs == [] and report == Counter({"down without alternative": 1})


def test_two_ups_and_two_downs_give_four_pairs_and_a_changed_mind_counts_last():
    interactions = [chat("a", Q1, "A"), chat("b", Q1, "B"), chat("c", Q1, "C"), chat("d", Q1, "D")]
    feedback = [row(1, "a", "up"), row(2, "b", "up"), row(3, "c", "down"), row(4, "d", "up"),
                row(5, "d", "down")]  # fmt: skip
    pairs, _ = preference_pairs(interactions, feedback)
    assert [(p.chosen, p.rejected) for p in pairs] == [("A", "C"), ("B", "C"), ("A", "D"), ("B", "D")]
