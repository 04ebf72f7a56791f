import math

import numpy as np
import pytest

from ponder.tools.retrieval import BM25Retriever, Document, Retriever, build_retriever
from ponder.tools.retrieval.bm25 import top_indices

# Fictional names make sure only the passage that mentions them can match.
DOCS = [
    Document("quellin", "Zorvath Quellin\nZorvath Quellin keeps the lighthouse on the isle of Brimmerhold."),
    Document("fenwick", "Marisol Fenwick\nMarisol Fenwick painted the ceiling of the Ostravenne cathedral."),
    Document("tarrow", "Tarrow Vell\nTarrow Vell founded the glassworks of Lunmere in the river valley."),
    Document("ostravenne", "Ostravenne\nOstravenne is a harbour town famous for its cathedral and its fog."),
]


@pytest.fixture(scope="module")
def retriever():
    return BM25Retriever(DOCS)


def test_bm25_finds_the_passage_that_names_the_entity(retriever):
    queries = ["Who keeps the lighthouse on Brimmerhold?", "Where are Tarrow Vell's glassworks?"]
    results = retriever.search(queries, topk=2)
    assert [hit.doc_id for hit in results[0]] == ["quellin"]
    assert results[1][0].doc_id == "tarrow"
    assert results[1][0].contents == DOCS[2].contents
    assert isinstance(retriever, Retriever)


def test_bm25_ranks_by_score_and_shares_terms(retriever):
    (hits,) = retriever.search(["Ostravenne cathedral"], topk=3)
    # Both passages mention both terms; the shorter one about the town itself wins on length norm.
    assert [hit.doc_id for hit in hits] == ["ostravenne", "fenwick"]
    assert hits[0].score > hits[1].score > 0


def test_topk_larger_than_corpus_is_clamped_and_unmatched_query_is_empty(retriever):
    (hits,) = retriever.search(["the isle of Brimmerhold and the Lunmere valley"], topk=50)
    assert [hit.doc_id for hit in hits] == ["quellin", "tarrow"]
    assert retriever.search(["the of and", "xylophone"], topk=3) == [[], []]


def test_bm25_score_matches_the_lucene_formula(retriever):
    # "fog" occurs once, only in the 9-token "ostravenne" passage (stopwords removed:
    # lengths 8, 8, 9, 9, so avgdl 8.5). Lucene BM25: idf * tf / (tf + k1 * (1 - b + b * dl / avgdl)).
    idf = math.log(1 + (4 - 1 + 0.5) / (1 + 0.5))
    expected = idf * 1 / (1 + 1.5 * (1 - 0.75 + 0.75 * 9 / 8.5))
    (hits,) = retriever.search(["fog?"], topk=3)
    assert [hit.doc_id for hit in hits] == ["ostravenne"]
    assert hits[0].score == pytest.approx(expected, rel=1e-6)
    assert hits[0].score == pytest.approx(0.469170, abs=1e-6)


def test_bm25_is_deterministic_across_builds():
    first = BM25Retriever(DOCS).search(["Ostravenne cathedral fog"], topk=4)
    second = BM25Retriever(list(DOCS)).search(["Ostravenne cathedral fog"], topk=4)
    assert first == second


def test_top_indices_breaks_ties_by_corpus_position():
    scores = np.array([0.5, 2.0, 0.5, 0.0, 2.0, 0.5], dtype=np.float32)
    assert top_indices(scores, 3).tolist() == [1, 4, 0]
    assert top_indices(scores, 4).tolist() == [1, 4, 0, 2]
    assert top_indices(scores, 100).tolist() == [1, 4, 0, 2, 5]
    assert top_indices(scores, 0).tolist() == []


def test_build_retriever_kinds():
    assert isinstance(build_retriever("bm25", DOCS), BM25Retriever)
    with pytest.raises(ValueError, match="^unknown retriever kind 'splade'; valid: bm25, dense, http, hybrid$"):
        build_retriever("splade", DOCS)
    with pytest.raises(ValueError, match="needs a non-empty list of documents"):
        build_retriever("bm25", None)
    with pytest.raises(ValueError, match="needs a url"):
        build_retriever("http", None)
