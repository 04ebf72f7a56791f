import itertools

import pytest

from ponder.tools.retrieval import Hit, HybridRetriever, reciprocal_rank_fusion


def _ranking(*doc_ids):
    return [Hit(doc_id, f"text of {doc_id}", 100.0 - i) for i, doc_id in enumerate(doc_ids)]


def test_rrf_hand_computed_scores():
    sparse = _ranking("a", "b", "c")
    dense = _ranking("b", "d", "a")
    fused = reciprocal_rank_fusion([sparse, dense], k=60)
    # a: 1/61 + 1/63, b: 1/62 + 1/61, c: 1/63, d: 1/62
    assert [hit.doc_id for hit in fused] == ["b", "a", "d", "c"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61, abs=1e-15)
    assert fused[1].score == pytest.approx(1 / 61 + 1 / 63, abs=1e-15)
    assert fused[2].score == pytest.approx(1 / 62, abs=1e-15)
    assert fused[3].score == pytest.approx(1 / 63, abs=1e-15)
    assert fused[0].contents == "text of b"


def test_rrf_small_k_and_topk():
    fused = reciprocal_rank_fusion([_ranking("x", "y"), _ranking("y", "z")], k=0, topk=2)
    # k=0: x = 1, y = 1/2 + 1 = 1.5, z = 1/2
    assert [(hit.doc_id, hit.score) for hit in fused] == [("y", 1.5), ("x", 1.0)]
    assert reciprocal_rank_fusion([], k=60) == []
    assert reciprocal_rank_fusion([_ranking("x")], topk=0) == []


def test_rrf_ties_are_broken_by_doc_id():
    fused = reciprocal_rank_fusion([_ranking("m", "k"), _ranking("k", "m"), _ranking("z"), _ranking("c")])
    # k and m tie at 1/61 + 1/62; c and z tie at 1/61.
    assert [hit.doc_id for hit in fused] == ["k", "m", "c", "z"]
    assert fused[0].score == fused[1].score
    assert fused[2].score == fused[3].score == pytest.approx(1 / 61)


def test_rrf_duplicate_in_one_ranking_counts_once_at_its_best_rank():
    fused = reciprocal_rank_fusion([_ranking("a", "b", "a")], k=60)
    assert [(hit.doc_id, hit.score) for hit in fused] == [("a", 1 / 61), ("b", 1 / 62)]


def test_rrf_does_not_depend_on_the_order_of_rankings():
    rankings = [
        _ranking("a", "b", "c", "d"),
        _ranking("d", "c", "e"),
        _ranking("c", "a", "f", "b"),
        _ranking("f", "e", "d", "a"),
    ]
    expected = reciprocal_rank_fusion(rankings, k=7, topk=5)
    assert len(expected) == 5
    for permutation in itertools.permutations(rankings):
        assert reciprocal_rank_fusion(list(permutation), k=7, topk=5) == expected


class _Fixed:
    """A retriever that returns canned rankings and records the depth it was asked for."""

    def __init__(self, ranking):
        self.ranking = ranking
        self.asked = []

    def search(self, queries, topk):
        self.asked.append(topk)
        return [self.ranking[:topk] for _ in queries]


def test_hybrid_retriever_fuses_per_query_with_depth():
    first, second = _Fixed(_ranking("a", "b", "c")), _Fixed(_ranking("c", "b"))
    hybrid = HybridRetriever([first, second], k=60, depth=3)
    results = hybrid.search(["q1", "q2"], topk=2)
    assert first.asked == [3] and second.asked == [3]
    # c: 1/63 + 1/61 beats b: 2/62 (1/x is convex), so the fused order is c, b.
    expected = [("c", 1 / 63 + 1 / 61), ("b", 1 / 62 + 1 / 62)]
    assert [[(hit.doc_id, hit.score) for hit in hits] for hits in results] == [expected, expected]
    hybrid.search(["q"], topk=10)
    assert first.asked[-1] == 10


def test_weighted_rrf_hand_computed_scores():
    sparse = _ranking("a", "b", "c")
    dense = _ranking("b", "d", "a")
    fused = reciprocal_rank_fusion([sparse, dense], k=0, weights=[1.0, 3.0])
    # k=0: a = 1/1 + 3/3 = 2, b = 1/2 + 3/1 = 3.5, c = 1/3, d = 3/2 = 1.5
    assert [(hit.doc_id, hit.score) for hit in fused] == [("b", 3.5), ("a", 2.0), ("d", 1.5), ("c", pytest.approx(1 / 3))]
    # Equal weights: b = 1/2 + 1 = 1.5 beats a = 1 + 1/3; a 3:1 vote for the first list
    # turns it round: a = 3 + 1/3, b = 3/2 + 1, c = 1, d = 1/2.
    equal = reciprocal_rank_fusion([sparse, dense], k=0)
    assert [(hit.doc_id, hit.score) for hit in equal][:2] == [("b", 1.5), ("a", pytest.approx(4 / 3))]
    sparse_heavy = reciprocal_rank_fusion([sparse, dense], k=0, weights=[3.0, 1.0])
    assert [(hit.doc_id, hit.score) for hit in sparse_heavy] == [
        ("a", pytest.approx(10 / 3)), ("b", 2.5), ("c", 1.0), ("d", 0.5)]


def test_weighted_rrf_with_unit_weights_is_plain_rrf():
    rankings = [_ranking("a", "b", "c", "d"), _ranking("d", "c", "e"), _ranking("c", "a", "f")]
    assert reciprocal_rank_fusion(rankings, k=60, weights=[1.0, 1.0, 1.0]) == reciprocal_rank_fusion(rankings, k=60)


def test_weighted_rrf_invariances():
    rankings = [_ranking("a", "b", "c", "d"), _ranking("d", "c", "e"), _ranking("c", "a", "f", "b")]
    weights = [1.0, 4.0, 2.5]
    expected = reciprocal_rank_fusion(rankings, k=5, weights=weights)
    order = lambda hits: [hit.doc_id for hit in hits]  # noqa: E731
    # The order of the (ranking, weight) pairs does not matter.
    for permutation in itertools.permutations(range(3)):
        fused = reciprocal_rank_fusion([rankings[i] for i in permutation], k=5, weights=[weights[i] for i in permutation])
        assert fused == expected
    # Scaling every weight by one constant scales every score and keeps the ranking.
    for factor in (0.5, 3.0, 10.0):
        scaled = reciprocal_rank_fusion(rankings, k=5, weights=[w * factor for w in weights])
        assert order(scaled) == order(expected)
        assert [hit.score for hit in scaled] == pytest.approx([hit.score * factor for hit in expected], rel=1e-12)


def test_weighted_rrf_rejects_bad_weights():
    with pytest.raises(ValueError, match="2 weights for 1 rankings"):
        reciprocal_rank_fusion([_ranking("a")], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="non-negative"):
        reciprocal_rank_fusion([_ranking("a")], weights=[-1.0])
    with pytest.raises(ValueError, match="2 weights for 1 retrievers"):
        HybridRetriever([_Fixed(_ranking("a"))], weights=[1.0, 2.0])


def test_hybrid_retriever_passes_its_weights():
    first, second = _Fixed(_ranking("a", "b")), _Fixed(_ranking("b", "a"))
    # Equal votes tie a and b (a wins on id); a 2:1 vote for the second retriever puts b first.
    assert [hit.doc_id for hit in HybridRetriever([first, second], k=60).search(["q"], 2)[0]] == ["a", "b"]
    weighted = HybridRetriever([first, second], k=60, weights=[1.0, 2.0]).search(["q"], 2)[0]
    assert [(hit.doc_id, hit.score) for hit in weighted] == [("b", pytest.approx(1 / 62 + 2 / 61)),
                                                              ("a", pytest.approx(1 / 61 + 2 / 62))]
