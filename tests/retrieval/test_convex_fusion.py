"""The convex combination of min-max normalised scores: hand-computed values and invariances."""

import itertools

import pytest

from ponder.tools.retrieval import Hit, HybridRetriever, convex_combination


def _scored(*pairs):
    return [Hit(doc_id, f"text of {doc_id}", score) for doc_id, score in pairs]


class _Fixed:
    def __init__(self, hits):
        self.hits = hits

    def search(self, queries, topk):
        return [self.hits[:topk] for _ in queries]


def test_convex_hand_computed_scores():
    bm25 = _scored(("a", 12.0), ("b", 8.0), ("c", 2.0))  # units a 1, b .6, c 0
    dense = _scored(("b", 0.9), ("d", 0.7), ("a", 0.4))  # units b 1, d .6, a 0
    fused = convex_combination([bm25, dense], weights=[1.0, 3.0])
    # a 1 + 0 = 1; b .6 + 3 = 3.6; c 0; d 3 * .6 = 1.8
    assert [(hit.doc_id, hit.score) for hit in fused] == [
        ("b", pytest.approx(3.6)), ("d", pytest.approx(1.8)), ("a", pytest.approx(1.0)), ("c", 0.0)]
    assert fused[0].contents == "text of b"
    assert [hit.doc_id for hit in convex_combination([bm25, dense], topk=2)] == ["b", "a"]  # b 1.6, a 1, d .6


def test_convex_edge_cases():
    assert convex_combination([]) == [] and convex_combination([[], []]) == []
    # One score (or all equal): every listed document gets 1 from that list.
    assert [(h.doc_id, h.score) for h in convex_combination([_scored(("x", 5.0), ("y", 5.0))])] == [
        ("x", 1.0), ("y", 1.0)]
    # A repeated document counts once, at its higher score (the lower one is dropped before scaling).
    fused = convex_combination([_scored(("a", 1.0), ("b", 3.0), ("a", 2.0), ("c", 2.5))])
    assert [(h.doc_id, h.score) for h in fused] == [("b", 1.0), ("c", 0.5), ("a", 0.0)]
    with pytest.raises(ValueError, match="non-negative"):
        convex_combination([_scored(("a", 1.0))], weights=[-1.0])


def test_convex_invariances():
    rankings = [_scored(("a", 3.0), ("b", 2.5), ("c", 0.5), ("d", 0.1)),
                _scored(("d", 0.8), ("c", 0.6), ("e", -0.2)),
                _scored(("c", 40.0), ("a", 31.0), ("f", 30.0), ("b", 7.0))]
    weights = [1.0, 4.0, 2.5]
    expected = convex_combination(rankings, weights=weights)
    order = lambda hits: [hit.doc_id for hit in hits]  # noqa: E731
    for permutation in itertools.permutations(range(3)):  # the order of the (ranking, weight) pairs
        assert convex_combination([rankings[i] for i in permutation], weights=[weights[i] for i in permutation]) \
            == expected
    for scale, shift in ((2.0, 0.0), (0.01, -5.0), (1000.0, 77.0)):  # any increasing affine map of one list's scores
        moved = [rankings[0], rankings[1], [Hit(h.doc_id, h.contents, h.score * scale + shift) for h in rankings[2]]]
        fused = convex_combination(moved, weights=weights)
        assert order(fused) == order(expected)
        assert [h.score for h in fused] == pytest.approx([h.score for h in expected], rel=1e-9)
    for factor in (0.5, 10.0):  # scaling every weight scales every score
        scaled = convex_combination(rankings, weights=[w * factor for w in weights])
        assert order(scaled) == order(expected)
        assert [h.score for h in scaled] == pytest.approx([h.score * factor for h in expected], rel=1e-12)


def test_hybrid_retriever_fuses_by_its_method():
    # BM25 barely prefers a; the dense retriever is sure of b. RRF with equal votes ties them
    # (a wins on id); the convex combination keeps the dense retriever's margin: b first.
    first = _Fixed(_scored(("a", 10.0), ("b", 9.9), ("c", 0.0)))
    second = _Fixed(_scored(("b", 0.9), ("a", 0.1), ("c", 0.0)))
    assert [h.doc_id for h in HybridRetriever([first, second]).search(["q"], 2)[0]] == ["a", "b"]
    convex = HybridRetriever([first, second], fusion="convex").search(["q"], 2)[0]
    assert [(h.doc_id, h.score) for h in convex] == [("b", pytest.approx(0.99 + 1.0)), ("a", pytest.approx(1 + 0.1 / 0.9))]
    with pytest.raises(ValueError, match="unknown fusion 'sum'"):
        HybridRetriever([first], fusion="sum")
