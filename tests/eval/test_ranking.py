"""Retrieval metrics against rankings scored by hand."""

import math

import pytest

from ponder.eval.ranking import ndcg_at_k, ranking_report, recall_at_k, reciprocal_rank


def test_hand_computed_ranking():
    ranked = ["c", "a", "d", "b", "e"]
    relevant = {"a", "b"}
    assert recall_at_k(ranked, relevant, 1) == 0.0
    assert recall_at_k(ranked, relevant, 2) == 0.5  # a at rank 2
    assert recall_at_k(ranked, relevant, 5) == 1.0
    assert reciprocal_rank(ranked, relevant) == 0.5
    # DCG@10 = 1/log2(3) + 1/log2(5); ideal = 1/log2(2) + 1/log2(3)
    expected = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(ranked, relevant, 10) == pytest.approx(expected)


def test_report_means_over_queries_and_skips_unlabelled():
    rankings = [["a", "x"], ["x", "y", "b"], ["z"], ["q"]]
    relevant = [{"a"}, {"b"}, {"nope"}, set()]
    report = ranking_report(rankings, relevant)
    assert report["queries"] == 3
    assert report["recall@1"] == pytest.approx(1 / 3)
    assert report["recall@5"] == pytest.approx(2 / 3)
    assert report["mrr"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert report["ndcg@10"] == pytest.approx((1 + 1 / math.log2(4)) / 3)


def test_repeats_count_once_and_order_of_queries_does_not_matter():
    assert recall_at_k(["a", "a", "a"], {"a", "b"}, 3) == 0.5
    assert ndcg_at_k(["x", "a", "a"], {"a"}, 10) == pytest.approx(1 / math.log2(3))
    rankings, relevant = [["a", "b"], ["b", "a"], ["c"]], [{"b"}, {"b"}, {"a"}]
    forward = ranking_report(rankings, relevant)
    backward = ranking_report(rankings[::-1], relevant[::-1])
    assert forward == pytest.approx(backward)


def test_paired_difference_hand_computed_and_antisymmetric():
    from ponder.eval.ranking import paired_difference

    first, second = [["a", "b"], ["x", "y", "z"], ["q"]], [["b", "a"], ["z", "y", "x"], ["q"]]
    relevant = [{"a"}, {"z"}, set()]  # the third query has no label: left out
    # reciprocal rank: q1 1 - 1/2 = +1/2, q2 1/3 - 1 = -2/3; mean -1/12, sd 7/12, se 7/12 / sqrt 2
    report = paired_difference(first, second, relevant)
    assert report["mrr"]["mean"] == pytest.approx(-1 / 12)
    assert report["mrr"]["se"] == pytest.approx(7 / 12 / 2**0.5)
    assert (report["mrr"]["better"], report["mrr"]["worse"]) == (1, 1)
    assert report["recall@5"] == {"mean": 0.0, "se": 0.0, "better": 0.0, "worse": 0.0}
    swapped = paired_difference(second, first, relevant)["mrr"]
    assert swapped["mean"] == pytest.approx(1 / 12) and swapped["se"] == pytest.approx(report["mrr"]["se"])
    assert (swapped["better"], swapped["worse"]) == (1, 1)
    with pytest.raises(ValueError, match="2 and 3 rankings for 3 relevance sets"):
        paired_difference(first[:2], second, relevant)
