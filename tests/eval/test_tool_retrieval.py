"""The validation split by function and the choice of the hybrid's dense weight on it."""

import json

import pytest

from ponder.eval.bfcl.data import LabelledQuery
from ponder.eval.tool_retrieval import _split_validation, fusion_sweep, is_validation_function
from ponder.tools.retrieval.toolindex import FUSION_FILE, read_dense_weight


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
    from ponder.eval.bfcl.data import is_test_function

    names = [f"tool{i}" for i in range(400)]
    assert [is_validation_function(n, 0.5, 0) for n in names] != [is_test_function(n, 0.5, 0) for n in names]


def test_fusion_sweep_hand_computed():
    # k=60. w=1: x = 1/61 + 1/62 beats t = 1/63 + 1/61, so t is second (MRR 1/2);
    # w=2: t = 1/63 + 2/61 = 0.048660 beats x = 1/61 + 2/62 = 0.048652 (MRR 1).
    bm25, dense, relevant = [["x", "y", "t"]], [["t", "x"]], [{"t"}]
    weight, rows = fusion_sweep(bm25, dense, relevant, grid=(1.0, 2.0))
    assert [(row["dense_weight"], row["recall@5"], row["mrr"]) for row in rows] == [(1.0, 1.0, 0.5), (2.0, 1.0, 1.0)]
    assert weight == 2.0


def test_fusion_sweep_ties_choose_the_smaller_weight():
    weight, rows = fusion_sweep([["t", "x"]], [["t", "x"]], [{"t"}], grid=(4.0, 1.0, 2.0))
    assert weight == 1.0 and all(row["mrr"] == 1.0 for row in rows)


def test_read_dense_weight(tmp_path):
    assert read_dense_weight(None) is None and read_dense_weight(tmp_path) is None
    (tmp_path / FUSION_FILE).write_text(json.dumps({"dense_weight": 3.0}))
    assert read_dense_weight(tmp_path) == pytest.approx(3.0) and read_dense_weight(str(tmp_path)) == 3.0


def test_an_unreadable_fusion_file_is_one_line_naming_it(tmp_path):
    from ponder.tools.retrieval.toolindex import ToolIndexError

    (tmp_path / FUSION_FILE).write_text('{"dense_weight":')
    with pytest.raises(ToolIndexError, match=rf"{FUSION_FILE}: unreadable fusion weight .*rerun `ponder tools train`"):
        read_dense_weight(tmp_path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"test_fraction": 1.0}, r"--test-fraction must be in \[0, 1\), got 1.0"),
    ({"validation_fraction": -0.1}, r"--validation-fraction must be in \[0, 1\), got -0.1"),
])
def test_split_fractions_outside_zero_one_are_refused(tmp_path, kwargs, message):
    from ponder.eval.tool_retrieval import prepare_data

    with pytest.raises(ValueError, match=message):  # before any data file is read
        prepare_data(tmp_path, **kwargs)
