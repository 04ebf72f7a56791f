"""The validation split by function and the choice of the hybrid's dense weight on it."""

import json

import pytest

from ponder.bfcl.data import LabelledQuery
from ponder.eval.tool_retrieval import _split_validation, fusion_sweep, is_validation_function
from ponder.tools.retrieval import Hit
from ponder.tools.retrieval.toolindex import FUSION_FILE, Fusion, read_fusion


def _queries(n):
    return [LabelledQuery(f"q{i}", "simple_python", f"query {i}", {f"tool{i}", f"tool{i + 1}"}) for i in range(n)]


def test_validation_split_is_by_function():
    queries = _queries(200)
    train, validation = _split_validation(queries, 0.3, seed=0)
    assert train and validation
    seen_in_training = {name for q in train for name in q.relevant}
    assert all(name not in seen_in_training for q in validation for name in q.relevant)
    assert all(is_validation_function(name, 0.3, 0) for q in validation for name in q.relevant)
    assert _split_validation(queries, 0.0, seed=0) == (queries, [])


def test_validation_coin_is_not_the_held_out_coin():
    from ponder.bfcl.data import is_test_function

    names = [f"tool{i}" for i in range(400)]
    assert [is_validation_function(n, 0.5, 0) for n in names] != [is_test_function(n, 0.5, 0) for n in names]


def _hits(*scored):
    return [Hit(name, "", score) for name, score in scored]


def test_fusion_sweep_hand_computed():
    # RRF, k=60. w=1: x = 1/61 + 1/62 beats t = 1/63 + 1/61, so t is second (MRR 1/2);
    # w=2: t = 1/63 + 2/61 = 0.048660 beats x = 1/61 + 2/62 = 0.048652 (MRR 1).
    # Convex, min-max per list: BM25 x 1, y 0.5, t 0; dense t 1, x 0.
    # w=1: x 1 + 0 = t 0 + 1, tie broken by name: t first (MRR 1); w=2 likewise t 2 > x 1.
    bm25, dense, relevant = [_hits(("x", 9.0), ("y", 6.0), ("t", 3.0))], [_hits(("t", 0.9), ("x", 0.5))], [{"t"}]
    chosen, rows = fusion_sweep(bm25, dense, relevant, grid=(1.0, 2.0))
    assert [(row["method"], row["dense_weight"], row["mrr"]) for row in rows] == [
        ("rrf", 1.0, 0.5), ("rrf", 2.0, 1.0), ("convex", 1.0, 1.0), ("convex", 2.0, 1.0)]
    assert chosen == Fusion("rrf", 2.0)  # ties go to RRF, then to the smaller weight


def test_fusion_sweep_can_choose_the_convex_combination():
    # q1: BM25 x 9, y 6, t 3 (units 1, .5, 0); dense t .9, x .1, y 0 (units 1, .111, 0).
    # q2: BM25 u 10, z 9.9, v 0 (units 1, .99, 0); dense v .99, u .98, z 0 (units 1, .9899, 0).
    # RRF w=2: q1 t = 1/63 + 2/61 = .048660 > x = 1/61 + 2/62 = .048651 (RR 1);
    #          q2 v = 1/63 + 2/61 > u = 1/61 + 2/62 (RR 1/2): MRR .75.
    # Convex w=2: q1 t = 2 > x = 1.222 (RR 1); q2 u = 1 + 2 * .9899 = 2.98 > v = 2 (RR 1): MRR 1.
    bm25 = [_hits(("x", 9.0), ("y", 6.0), ("t", 3.0)), _hits(("u", 10.0), ("z", 9.9), ("v", 0.0))]
    dense = [_hits(("t", 0.9), ("x", 0.1), ("y", 0.0)), _hits(("v", 0.99), ("u", 0.98), ("z", 0.0))]
    chosen, rows = fusion_sweep(bm25, dense, [{"t"}, {"u"}], grid=(2.0,))
    assert {row["method"]: row["mrr"] for row in rows} == {"rrf": pytest.approx(0.75), "convex": pytest.approx(1.0)}
    assert chosen == Fusion("convex", 2.0)


def test_fusion_sweep_ties_choose_the_smaller_weight():
    chosen, rows = fusion_sweep([_hits(("t", 2.0), ("x", 1.0))], [_hits(("t", 0.9), ("x", 0.1))], [{"t"}],
                                grid=(4.0, 1.0, 2.0))
    assert chosen == Fusion("rrf", 1.0) and all(row["mrr"] == 1.0 for row in rows)


def test_read_fusion(tmp_path):
    assert read_fusion(None) is None and read_fusion(tmp_path) is None
    (tmp_path / FUSION_FILE).write_text(json.dumps({"dense_weight": 3.0}))  # written before the method was chosen
    assert read_fusion(tmp_path) == Fusion("rrf", 3.0) and read_fusion(str(tmp_path)) == Fusion("rrf", 3.0)
    (tmp_path / FUSION_FILE).write_text(json.dumps({"method": "convex", "dense_weight": 4.0}))
    assert read_fusion(tmp_path) == Fusion("convex", 4.0)


def test_an_unknown_fusion_method_is_refused_naming_the_file(tmp_path):
    from ponder.tools.retrieval.toolindex import ToolIndexError

    (tmp_path / FUSION_FILE).write_text(json.dumps({"method": "sum", "dense_weight": 4.0}))
    with pytest.raises(ToolIndexError, match=rf"{FUSION_FILE}: unknown fusion 'sum'"):
        read_fusion(tmp_path)


def test_an_unreadable_fusion_file_is_one_line_naming_it(tmp_path):
    from ponder.tools.retrieval.toolindex import ToolIndexError

    (tmp_path / FUSION_FILE).write_text('{"dense_weight":')
    with pytest.raises(ToolIndexError, match=rf"{FUSION_FILE}: unreadable fusion choice .*rerun `ponder tools train`"):
        read_fusion(tmp_path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"test_fraction": 1.0}, r"--test-fraction must be in \[0, 1\), got 1.0"),
    ({"validation_fraction": -0.1}, r"--validation-fraction must be in \[0, 1\), got -0.1"),
])
def test_split_fractions_outside_zero_one_are_refused(tmp_path, kwargs, message):
    from ponder.eval.tool_retrieval import prepare_data

    with pytest.raises(ValueError, match=message):  # before any data file is read
        prepare_data(tmp_path, **kwargs)


def _cv_data(n_tools=40):
    """A small training set by hand: tool i answers queries about word i (and pairs of
    neighbours), over a corpus of real ToolSpecs."""
    from ponder.bfcl.data import ToolCorpus
    from ponder.eval.tool_retrieval import ToolRetrievalData
    from ponder.tools.retrieval.toolindex import tool_text
    from ponder.types import ToolSpec

    words = ["weather", "stock", "flight", "recipe", "translate", "convert", "calendar", "email", "map", "music"]
    specs = [ToolSpec(f"tool_{i}", f"look up {words[i % 10]} number {i}", {"type": "object", "properties": {}})
             for i in range(n_tools)]
    queries = [LabelledQuery(f"q{i}", "simple_python", f"please {words[i % 10]} number {i}", {f"tool_{i}"})
               for i in range(n_tools)]
    queries += [LabelledQuery(f"p{i}", "parallel", f"{words[i % 10]} {i} and {i + 1}", {f"tool_{i}", f"tool_{i + 1}"})
                for i in range(0, n_tools - 1, 3)]
    corpus = ToolCorpus(specs, read=n_tools, variants=n_tools)
    return ToolRetrievalData(corpus, queries, [], [], {s.name: tool_text(s) for s in specs}, 0.3, 0)


def test_folds_partition_the_training_functions_and_queries():
    from ponder.eval.tool_retrieval import fold_data, function_fold

    data = _cv_data()
    folds = [function_fold(spec.name, 4, 0) for spec in data.corpus.specs]
    assert set(folds) == {0, 1, 2, 3} and folds == [function_fold(s.name, 4, 0) for s in data.corpus.specs]
    seen = []
    for fold in range(4):
        part, validation = fold_data(data, fold, 4)
        held = {name for q in validation for name in q.relevant}
        assert all(function_fold(name, 4, 0) == fold for name in held)
        assert not held & {name for q in part.train for name in q.relevant}  # never trained on
        assert not held & set(part.train_tools)  # nor mined as a hard negative
        seen += [q.id for q in validation]
    assert len(seen) == len(set(seen))  # each query scored by at most one fold
    single = [q.id for q in data.train if len(q.relevant) == 1]
    assert set(single) <= set(seen)  # a one-tool query always lands in its tool's fold


def test_cross_validated_fusion_pools_out_of_fold_rankings():
    from ponder.eval.tool_retrieval import cross_validated_fusion, function_fold
    from ponder.tools.retrieval.finetune import ContrastiveConfig
    from ponder.tools.retrieval.toolindex import load_tool_encoder

    data = _cv_data()
    encoder = load_tool_encoder(None)  # the base encoder stands in for each fold's training
    trained_on = []

    def train(examples):
        trained_on.append({example.positive_id for example in examples})
        return encoder

    fusion = cross_validated_fusion(data, ContrastiveConfig(hard_negatives=0), 3, train, say=lambda _: None)
    assert len(trained_on) == 3
    for fold, names in enumerate(trained_on):
        assert names and all(function_fold(name, 3, 0) != fold for name in names)
    assert fusion["folds"] == 3 and fusion["dense_weight"] in fusion["grid"] and fusion["method"] in fusion["methods"]
    assert 0 < fusion["validation_queries"] <= len(data.train)
    assert len(fusion["sweep"]) == len(fusion["grid"]) * len(fusion["methods"])
    best = max((row["recall@5"], row["mrr"]) for row in fusion["sweep"])
    chosen = [row for row in fusion["sweep"]
              if (row["method"], row["dense_weight"]) == (fusion["method"], fusion["dense_weight"])]
    assert (chosen[0]["recall@5"], chosen[0]["mrr"]) == best
    assert fusion["single_retrievers"]["bm25"]["recall@5"] > 0.5  # the queries name their tool's words


def test_cross_validation_refuses_a_validation_split_too():
    from dataclasses import replace

    from ponder.eval.tool_retrieval import cross_validated_fusion

    data = _cv_data()
    with pytest.raises(ValueError, match="validation_fraction 0"):
        cross_validated_fusion(replace(data, validation=data.train[:2]), None, 3, lambda _: None)


def test_the_tuned_hybrid_row_carries_its_paired_difference_from_the_encoder():
    from dataclasses import replace

    from ponder.eval.tool_retrieval import evaluate_retrievers, retrieval_markdown
    from ponder.tools.retrieval.toolindex import load_tool_encoder

    data = _cv_data()
    data = replace(data, test=data.train[:30], live=data.train[30:])
    rows = evaluate_retrievers(data, load_tool_encoder(None), only=["tuned", "hybrid-weighted"],
                               fusion=Fusion("convex", 4.0))
    by = {(row["retriever"], row["split"]): row for row in rows}
    assert set(by) == {(name, split) for name in ("dense (fine-tuned)", "hybrid (BM25 + fine-tuned, convex, dense weight 4)")
                       for split in ("held-out", "live")}
    for split in ("held-out", "live"):
        hybrid, dense = by["hybrid (BM25 + fine-tuned, convex, dense weight 4)", split], by["dense (fine-tuned)", split]
        paired = hybrid["vs_fine_tuned"]
        # the mean of per-query differences is the difference of the means
        assert paired["recall@5"]["mean"] == pytest.approx(hybrid["recall@5"] - dense["recall@5"], abs=1e-12)
        assert paired["mrr"]["mean"] == pytest.approx(hybrid["mrr"] - dense["mrr"], abs=1e-12)
        assert paired["mrr"]["better"] + paired["mrr"]["worse"] <= hybrid["queries"]
        assert "vs_fine_tuned" not in dense
    table = retrieval_markdown(rows)
    assert table.count("minus dense (fine-tuned): recall@5") == 2
