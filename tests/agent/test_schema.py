import pytest

from ponder.agent.schema import check_answer, extract_json
from ponder.agent.state import ANSWERED, ERROR, FAILED
from ponder.tools import tool

from .conftest import call, scripted_agent

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "text, value",
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Here it is: {"a": [1, 2]}', {"a": [1, 2]}),
        ("[1, 2]", [1, 2]),
        ("42", 42),
    ],
)
def test_extract_json(text, value):
    assert extract_json(text) == (value, None)


@pytest.mark.parametrize(
    "text, error",
    [("", "the answer is empty"), ('{"a": 1} and more', "unexpected text after"), ("{oops", "not valid JSON")],
)
def test_extract_json_errors(text, error):
    value, message = extract_json(text)
    assert value is None and message.startswith(error)


def test_check_answer_names_every_problem():
    value, error = check_answer('{"name": 3, "extra": true}', PERSON)
    assert value is None
    assert "field 'name' must be string, got 3" in error
    assert "missing required field 'age'" in error
    assert "unexpected field 'extra'" in error


def test_valid_answer_first_time(tokenizer):
    agent, _ = scripted_agent(tokenizer, ['{"name": "Ada", "age": 36}'], answer_schema=PERSON)
    state = agent.run("who?", key="t1")
    assert (state.status, state.answer, state.counters.corrections) == (ANSWERED, {"name": "Ada", "age": 36}, 0)
    assert "JSON Schema" in state.messages[0]["content"]


def test_invalid_answer_is_fed_back_and_corrected(tokenizer):
    turns = ['{"name": "Ada", "age": "36"}', 'Sorry: {"name": "Ada", "age": 36}']
    agent, _ = scripted_agent(tokenizer, turns, answer_schema=PERSON, max_corrections=2)
    state = agent.run("who?", key="t1")
    assert (state.status, state.answer, state.counters.corrections) == (ANSWERED, {"name": "Ada", "age": 36}, 1)
    feedback = state.messages[3]["content"]
    assert "field 'age' must be integer, got \"36\"" in feedback and "correction 1 of 2" in feedback
    assert state.turns[0].error.startswith("answer does not match the schema")


def test_self_correction_is_bounded(tokenizer):
    agent, backend = scripted_agent(tokenizer, ["not json"] * 10, answer_schema=PERSON, max_corrections=2)
    state = agent.run("who?", key="t1")
    assert (state.status, state.stop_reason, state.answer) == (FAILED, "schema_failed", None)
    assert "after 2 corrections" in state.error
    assert backend.turns_served["t1"] == 3  # the first answer and two corrections


def test_an_invalid_schema_is_a_recorded_error_without_model_calls(tokenizer):
    agent, backend = scripted_agent(tokenizer, ["{}"], answer_schema={"type": "nonsense"})
    state = agent.run("q", key="t1")
    assert (state.status, state.stop_reason) == (ERROR, "invalid_schema")
    assert state.error.startswith("answer_schema is not a valid JSON Schema at type:")
    assert backend.turns_served["t1"] == 0


def test_tool_arguments_are_validated_before_any_call(tokenizer):
    calls = []

    @tool
    def scale(x: int, factor: float = 2.0) -> float:
        """Scale a number.

        Args:
            x: The number.
            factor: The factor.
        """
        calls.append(x)
        return x * factor

    turns = [call("scale", x="seven", factor=2), call("scale", y=1), call("scale", x=7), "14"]
    agent, _ = scripted_agent(tokenizer, turns, tools=[scale])
    state = agent.run("q", key="t1")
    assert calls == [7]
    assert state.messages[3]["content"] == "<tool_response>\n[output of tool 'scale'; untrusted data]\nerror: scale: argument 'x' must be integer, got \"seven\"\n</tool_response>"
    assert "unexpected argument 'y'" in state.messages[5]["content"]
    assert "missing required argument 'x'" in state.messages[5]["content"]
    assert [a.ok for a in state.trace] == [False, False, True]
