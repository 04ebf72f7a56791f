"""Tool index: schema normalisation, BM25/dense/hybrid search over ToolSpecs, save/load
with the encoder fingerprint, query truncation, and contrastive steps lowering the loss."""

import json

import pytest

from ponder.tools.retrieval.finetune import (
    ContrastiveConfig, ContrastiveExample, batches_without_duplicates, train_encoder,
)
from ponder.tools.retrieval.toolindex import (
    Fusion, ToolIndex, ToolIndexError, load_tool_encoder, normalise_parameters, tool_text, truncate_query,
)
from ponder.types import ToolSpec

TOOLS = [
    ToolSpec("math.factorial", "Calculate the factorial of a given number.",
             {"type": "object", "properties": {"number": {"type": "integer", "description": "The number."}}}),
    ToolSpec("get_weather", "Current weather for a city.",
             {"type": "object", "properties": {"city": {"type": "string", "description": "City name."}}}),
    ToolSpec("book_flight", "Book a flight between two airports on a date.",
             {"type": "object", "properties": {"origin": {"type": "string"}, "destination": {"type": "string"}}}),
]


def test_bfcl_dialect_types_are_normalised_and_bad_schemas_skipped():
    schema, reason = normalise_parameters(
        {"type": "dict", "properties": {"x": {"type": "float"}, "y": {"type": "tuple", "items": {"type": "any"}},
                                        "z": {"type": "ArrayList"}}, "required": ["x"]})
    assert reason is None
    assert schema["type"] == "object" and schema["properties"]["x"]["type"] == "number"
    assert schema["properties"]["y"] == {"type": "array", "items": {"x-original-type": "any"}}
    assert "type" not in schema["properties"]["z"]
    assert normalise_parameters("not a schema")[0] is None
    assert normalise_parameters({"type": "string"})[1] == "parameters has type 'string', not 'object'"
    assert normalise_parameters({"type": "object", "properties": {"a": {"minimum": "low"}}})[0] is None
    assert normalise_parameters({"type": "object", "properties": {}, "required": "a"})[0] == {"type": "object", "properties": {}}


def test_tool_text_has_name_words_description_and_parameters():
    text = tool_text(TOOLS[0])
    assert text.startswith("math factorial.") and "factorial of a given number" in text
    assert "number (integer): The number" in text


def test_bm25_ranks_tools_by_name():
    index = ToolIndex(TOOLS, kind="bm25")
    assert index.rank_names(["what is the weather in Paris", "factorial of 5"], 2) == [["get_weather"], ["math.factorial"]]
    with pytest.raises(ToolIndexError, match="appears twice"):
        ToolIndex(TOOLS + [TOOLS[0]], kind="bm25")


def test_hybrid_save_load_and_encoder_refusal(tmp_path):
    index = ToolIndex(TOOLS, kind="hybrid")
    assert index.rank_names(["book a plane ticket to Rome"], 1) == [["book_flight"]]
    index.save(tmp_path / "idx")
    loaded = ToolIndex.load(tmp_path / "idx")
    assert loaded.rank_names(["book a plane ticket to Rome"], 3) == index.rank_names(["book a plane ticket to Rome"], 3)
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    meta["encoder"]["fingerprint"] = "0123456789abcdef"
    (tmp_path / "idx" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ToolIndexError, match="built with encoder 0123456789abcdef"):
        ToolIndex.load(tmp_path / "idx")


@pytest.mark.parametrize("method", ["rrf", "convex"])
def test_hybrid_fusion_is_saved_and_loaded(tmp_path, method):
    index = ToolIndex(TOOLS, kind="hybrid", fusion=Fusion(method, 6.0))
    assert index._retriever.weights == [1.0, 6.0]  # BM25 first, dense second
    index.save(tmp_path / "idx")
    loaded = ToolIndex.load(tmp_path / "idx")
    assert loaded.fusion == {"rrf_k": 60, "depth": 50, "dense_weight": 6.0, "method": method}
    assert loaded._retriever.weights == [1.0, 6.0] and loaded._retriever.fusion == method
    query = ["book a plane ticket to Rome"]
    assert [[h.score for h in hits] for hits in loaded.search(query, 3)] == \
        [[h.score for h in hits] for hits in index.search(query, 3)]


def test_long_query_is_truncated_with_a_note():
    model = load_tool_encoder()
    text, note = truncate_query("weather " * 1000, model)
    assert note is not None and "truncated from 1000 to" in note
    assert truncate_query("short query", model) == ("short query", None)
    index = ToolIndex(TOOLS, kind="dense", encoder=model)
    assert index.rank_names(["weather " * 1000], 1) == [["get_weather"]]
    assert index.notes and "truncated" in index.notes[0]


def test_batches_never_repeat_a_positive():
    examples = [ContrastiveExample(f"q{i}", f"tool {i % 3}", [], f"t{i % 3}") for i in range(12)]
    for batch in batches_without_duplicates(examples, batch_size=4, seed=0):
        assert len({e.positive_id for e in batch}) == len(batch) <= 3


def test_a_few_contrastive_steps_lower_the_loss():
    queries = ["factorial of 7", "is it raining in Oslo", "fly from JFK to LAX", "compute 10 factorial",
               "temperature in Tokyo today", "book a plane to Paris"]
    texts = [tool_text(TOOLS[i % 3]) for i in range(6)]
    names = [TOOLS[i % 3].name for i in range(6)]
    examples = [ContrastiveExample(q, t, [tool_text(TOOLS[(i + 1) % 3])], n)
                for i, (q, t, n) in enumerate(zip(queries, texts, names))]
    config = ContrastiveConfig(epochs=4, batch_size=3, learning_rate=1e-4, warmup_fraction=0.0, seed=0)
    _, result = train_encoder(examples, config)
    assert result.steps >= 6
    assert sum(result.losses[-2:]) / 2 < sum(result.losses[:2]) / 2
