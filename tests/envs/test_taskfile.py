import json

import pytest

from ponder.envs.synthetic import TaskGenConfig, generate_world
from ponder.envs.taskfile import TaskFileError, load_tasks, write_jsonl
from ponder.types import Task

GOOD = {"id": "q1", "question": "Where?", "answers": ["Paris"]}


def _write_lines(tmp_path, lines):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_round_trip_of_generated_tasks(tmp_path):
    world = generate_world(TaskGenConfig(seed=3, n_people=20, n_train=12, n_eval=4))
    path = tmp_path / "sub" / "train.jsonl"
    write_jsonl(path, [t.to_dict() for t in world.train])
    assert load_tasks(path) == world.train
    write_jsonl(tmp_path / "corpus.jsonl", world.corpus)
    rows = [json.loads(line) for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    assert rows == world.corpus


def test_write_replaces_whole_file_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_jsonl(path, [GOOD, {**GOOD, "id": "q2"}])
    write_jsonl(path, [GOOD])
    assert path.read_text() == json.dumps(GOOD) + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.jsonl"]


def test_failed_write_keeps_old_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_jsonl(path, [GOOD])
    with pytest.raises(TypeError):
        write_jsonl(path, [GOOD, {"id": object()}])
    assert load_tasks(path) == [Task(id="q1", question="Where?", answers=["Paris"])]
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.jsonl"]


def test_blank_lines_skipped_unknown_keys_kept_in_metadata_int_id_kept_as_text(tmp_path):
    path = _write_lines(
        tmp_path, ["", json.dumps({**GOOD, "extra": 1}), "   ", json.dumps({**GOOD, "id": 7})]
    )
    tasks = load_tasks(path)
    assert [t.id for t in tasks] == ["q1", "7"]
    assert tasks[0] == Task(id="q1", question="Where?", answers=["Paris"], metadata={"extra": 1})
    assert tasks[1] == Task(id="7", question="Where?", answers=["Paris"])


def test_null_oracle_actions_and_metadata_load_as_empty(tmp_path):
    # found by the fuzzer: a null was checked as [] and then stored as None
    path = _write_lines(tmp_path, [json.dumps({**GOOD, "oracle_actions": None, "metadata": None})])
    (task,) = load_tasks(path)
    assert task.oracle_actions == [] and task.metadata == {}


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ('{"id": "q4", "question": ', "tasks.jsonl:4: not valid JSON"),
        ('["q4"]', "tasks.jsonl:4: expected a JSON object, got list"),
        ('{"question": "Where?", "answers": ["x"]}', "tasks.jsonl:4: missing 'id'"),
        ('{"id": "q4", "answers": ["x"]}', "tasks.jsonl:4: task 'q4' has no 'question'"),
        ('{"id": "q4", "question": "Where?"}', "tasks.jsonl:4: task 'q4' has no gold answer"),
        ('{"id": "q4", "question": "Where?", "answers": []}', "tasks.jsonl:4: task 'q4' has no gold answer"),
        (
            '{"id": "q4", "question": "Where?", "answers": "Paris"}',
            "tasks.jsonl:4: task 'q4' has no gold answer",
        ),
        ('{"id": "q4", "question": "Where?", "answers": [" "]}', "tasks.jsonl:4: task 'q4' has an empty"),
        (
            '{"id": "q4", "question": "Where?", "answers": [3]}',
            "tasks.jsonl:4: task 'q4' has an empty or non-string",
        ),
        (
            '{"id": "q1", "question": "Again?", "answers": ["x"]}',
            "tasks.jsonl:4: duplicate task id 'q1' (first on line 1)",
        ),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, monkeypatch, bad_row, message):
    monkeypatch.chdir(tmp_path)
    # line 3 is blank: numbering counts physical lines, not tasks
    _write_lines(tmp_path, [json.dumps(GOOD), json.dumps({**GOOD, "id": "q2"}), "", bad_row])
    with pytest.raises(TaskFileError) as err:
        load_tasks("tasks.jsonl")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(TaskFileError, match="nope.jsonl: cannot read task file"):
        load_tasks(tmp_path / "nope.jsonl")
