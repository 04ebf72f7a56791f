"""Reading BFCL-format data: dedupe by name, invalid schemas skipped with a count, and a
split by function that never puts a held-out tool into training."""

import json

from ponder.bfcl.data import (
    LabelledQuery, is_test_function, labelled_queries, load_questions, load_tool_corpus, split_by_function,
)


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")


def _fn(name, params=None):
    return {"name": name, "description": f"{name} does things",
            "parameters": params or {"type": "dict", "properties": {"x": {"type": "float"}}, "required": ["x"]}}


def test_corpus_dedupes_by_name_and_counts_skipped_schemas(tmp_path):
    _write(tmp_path / "BFCL_v4_simple_python.json", [
        {"id": "simple_python_0", "question": [[{"role": "user", "content": "do a"}]], "function": [_fn("a")]},
        {"id": "simple_python_1", "question": [[{"role": "user", "content": "do a again"}]],
         "function": [_fn("a", {"type": "dict", "properties": {"y": {"type": "string"}}})]},
        {"id": "simple_python_2", "question": [[{"role": "user", "content": "bad"}]],
         "function": [_fn("bad", {"type": "dict", "properties": {"z": {"type": "integer", "minimum": "low"}}}),
                      {"description": "no name"}, _fn("listy", ["not", "a", "schema"])]},
    ])
    _write(tmp_path / "possible_answer" / "BFCL_v4_simple_python.json", [
        {"id": "simple_python_0", "ground_truth": [{"a": {"x": [1.0]}}]},
        {"id": "simple_python_1", "ground_truth": [{"a": {"y": ["q"]}}]},
        {"id": "simple_python_2", "ground_truth": [{"bad": {"z": [1]}}]},
    ])
    (tmp_path / "BFCL_v4_format_sensitivity.json").write_text('{\n "not": "entries"\n}\n')
    corpus = load_tool_corpus(tmp_path)
    assert [s.name for s in corpus.specs] == ["a"]
    assert corpus.specs[0].parameters["properties"]["x"]["type"] == "number"  # the first variant wins
    assert corpus.read == 5 and corpus.variants == 2
    assert sum(corpus.skipped.values()) == 3
    assert "3 skipped for invalid schemas" in corpus.summary()
    questions = load_questions(tmp_path, "simple_python")
    assert questions[0].query == "do a" and questions[0].answer_names == {"a"}
    assert [q.relevant for q in labelled_queries(tmp_path, ("simple_python",))] == [{"a"}, {"a"}, {"bad"}]


def test_split_by_function_keeps_test_tools_out_of_training():
    names = [f"tool_{i}" for i in range(200)]
    queries = [LabelledQuery(str(i), "c", f"q{i}", {names[i], names[(i * 7) % 200]}) for i in range(200)]
    train, test = split_by_function(queries, test_fraction=0.3, seed=1)
    test_tools = {n for n in names if is_test_function(n, 0.3, 1)}
    assert 30 < len(test_tools) < 90
    assert train and test
    assert all(not (q.relevant & test_tools) for q in train)
    assert all(q.relevant <= test_tools for q in test)
    # the coin is a function of (seed, name) only: the same split however queries are ordered
    again_train, again_test = split_by_function(queries[::-1], test_fraction=0.3, seed=1)
    assert {q.id for q in again_test} == {q.id for q in test}
