import os

import pytest

from ponder.types import (
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
    load_trajectories,
    save_trajectories,
)


def rich_trajectory() -> Trajectory:
    """Every kind of value a trajectory holds, including awkward ones."""
    search = ToolCall(
        "search",
        {
            "query": "Varo Quennick",
            "filters": {"year": [1990, 1999], "tags": ["a", {"deep": None}]},
            "k": 2.5,
        },
        raw="<search>Varo Quennick</search>",
        id="call-1",
    )
    return Trajectory(
        task_id="train-0001",
        prompt_ids=[1, 2, 3, 500],
        response_ids=[10, 11, 12, 13, 14],
        loss_mask=[1, 1, 0, 0, 1],
        # values whose float repr is long: any float32 round trip would change them
        old_logprobs=[-0.1, -1 / 3, 0.0, 0.0, -2.718281828459045e-7],
        turns=[
            Turn(
                index=0,
                action="<think>Qui est né à Zürich? 日本語 🦉</think>\n<search>Varo</search>",
                observation="\n\n<information>Doc 1 (Title: Varo) naïve — “quoted”</information>",
                tool_calls=[search, ToolCall("calc", {}, raw="", id=None)],
                tool_results=[
                    ToolResult("Doc 1 (Title: Varo) ...", False, "search", 0.125),
                    ToolResult("calc raised ZeroDivisionError", True, "calc", 0.0),
                ],
                n_action_tokens=2,
                n_observation_tokens=2,
            ),
            Turn(index=1, action="<answer>Zürich</answer>", answer="Zürich", n_action_tokens=1),
        ],
        reward=0.95,
        breakdown={"em": 1.0, "format": 1.0, "search_cost": -0.05},
        metrics={"turns": 2.0, "searches": 1.0},
        group_id="train-0001",
        stop_reason="answer",
    )


def bare_trajectory() -> Trajectory:
    return Trajectory(task_id="t-empty", prompt_ids=[7])


def test_round_trip_is_lossless(tmp_path):
    path = tmp_path / "trajectories.parquet"
    unscored = rich_trajectory()
    unscored.task_id, unscored.reward, unscored.breakdown = "train-0002", None, {}
    originals = [rich_trajectory(), unscored, bare_trajectory()]
    save_trajectories(originals, path)
    loaded = load_trajectories(path)
    assert loaded == originals
    assert loaded[1].reward is None and loaded[1].breakdown == {}
    # nested arguments come back as dicts and lists, not JSON text
    assert loaded[0].turns[0].tool_calls[0].arguments["filters"]["tags"][1] == {"deep": None}
    # exactly preserved floats (not float32), compared bit for bit
    assert [x.hex() for x in loaded[0].old_logprobs] == [x.hex() for x in originals[0].old_logprobs]
    assert loaded[0].final_answer == "Zürich"
    assert loaded[0].turns[0].observation.endswith("“quoted”</information>")


def test_round_trip_of_no_trajectories(tmp_path):
    path = tmp_path / "empty.parquet"
    save_trajectories([], path)
    assert load_trajectories(path) == []


def test_save_creates_missing_parent_directories(tmp_path):
    path = tmp_path / "run" / "eval" / "trajectories.parquet"
    save_trajectories([bare_trajectory()], path)
    assert load_trajectories(path) == [bare_trajectory()]


def test_save_leaves_no_temp_files(tmp_path):
    path = tmp_path / "trajectories.parquet"
    save_trajectories([rich_trajectory()], path)
    save_trajectories([bare_trajectory()], path)  # overwrite in place
    assert sorted(os.listdir(tmp_path)) == ["trajectories.parquet"]
    assert load_trajectories(path) == [bare_trajectory()]


def test_failed_save_keeps_previous_file_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "trajectories.parquet"
    save_trajectories([rich_trajectory()], path)
    before = path.read_bytes()
    broken = rich_trajectory()
    broken.turns[0].tool_calls[0].arguments["when"] = object()  # not JSON-serialisable
    with pytest.raises(TypeError):
        save_trajectories([bare_trajectory(), broken], path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["trajectories.parquet"]
    assert load_trajectories(path) == [rich_trajectory()]


def test_failed_save_with_wrong_column_type_keeps_previous_file(tmp_path):
    path = tmp_path / "trajectories.parquet"
    save_trajectories([bare_trajectory()], path)
    before = path.read_bytes()
    broken = rich_trajectory()
    broken.old_logprobs = ["not a float"] * 5
    with pytest.raises(ValueError):  # pyarrow's ArrowInvalid
        save_trajectories([broken], path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["trajectories.parquet"]


def test_failed_rename_removes_the_written_temp_file(tmp_path):
    # The target is a non-empty directory: the Parquet file is written, then the
    # rename onto the target fails, which must not leave the temp file behind.
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(OSError):
        save_trajectories([rich_trajectory()], target)
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    assert (target / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "field, value",
    [("loss_mask", [1, 1, 0, 0]), ("old_logprobs", [0.0] * 6), ("response_ids", [1])],
)
def test_check_raises_on_length_mismatch(field, value):
    trajectory = rich_trajectory()
    trajectory.check()  # consistent as built
    setattr(trajectory, field, value)
    with pytest.raises(ValueError, match="differ in length"):
        trajectory.check()


def test_check_raises_on_mask_values_other_than_0_and_1():
    trajectory = rich_trajectory()
    trajectory.loss_mask = [1, 2, 0, 0, 1]
    with pytest.raises(ValueError, match="0/1"):
        trajectory.check()


def test_final_answer_is_the_last_turn_that_answered():
    trajectory = Trajectory(
        task_id="t",
        prompt_ids=[],
        turns=[
            Turn(0, "<answer>first</answer>", answer="first"),
            Turn(1, "<answer>second</answer>", answer="second"),
            Turn(2, "<search>more</search>", observation="obs"),
            Turn(3, "no tag", error="no tag found"),
        ],
    )
    assert trajectory.final_answer == "second"
    assert Trajectory(task_id="t", prompt_ids=[], turns=[Turn(0, "<search>q</search>")]).final_answer is None
    assert bare_trajectory().final_answer is None


def test_final_answer_keeps_an_empty_string_answer():
    trajectory = Trajectory(
        task_id="t", prompt_ids=[], turns=[Turn(0, "a", answer="x"), Turn(1, "b", answer="")]
    )
    assert trajectory.final_answer == ""


def test_response_text_joins_actions_and_observations():
    trajectory = Trajectory(
        task_id="t",
        prompt_ids=[],
        turns=[
            Turn(0, "<search>q</search>", observation="<information>x</information>"),
            Turn(1, "<answer>a</answer>"),
        ],
    )
    assert trajectory.response_text == "<search>q</search><information>x</information><answer>a</answer>"


def test_saved_file_has_ordinary_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        path = tmp_path / "trajectories.parquet"
        save_trajectories([bare_trajectory()], path)
        assert os.stat(path).st_mode & 0o777 == 0o644
    finally:
        os.umask(previous)


def test_saved_file_loads_with_hugging_face_datasets(tmp_path):
    import datasets

    path = tmp_path / "trajectories.parquet"
    originals = [rich_trajectory(), bare_trajectory()]
    save_trajectories(originals, path)
    dataset = datasets.load_dataset(
        "parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert dataset.num_rows == 2
    assert dataset[0]["breakdown"] == [
        {"key": "em", "value": 1.0}, {"key": "format", "value": 1.0}, {"key": "search_cost", "value": -0.05},
    ]
    assert dataset[0]["metrics"] == [{"key": "turns", "value": 2.0}, {"key": "searches", "value": 1.0}]
    assert dataset[1]["breakdown"] == [] and dataset[0]["loss_mask"] == [1, 1, 0, 0, 1]
    # a row as datasets gives it back is a trajectory again, unchanged
    assert [Trajectory.from_row(row) for row in dataset] == originals


def test_files_written_with_map_columns_still_load(tmp_path):
    # Files written before breakdown and metrics became lists of {key, value}
    # stored them as Parquet maps.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ponder.types import _parquet_schema

    schema = _parquet_schema()
    for name in ("breakdown", "metrics"):
        schema = schema.set(schema.get_field_index(name), pa.field(name, pa.map_(pa.string(), pa.float64())))
    rows = []
    for trajectory in (rich_trajectory(), bare_trajectory()):
        row = trajectory.to_row()
        row["breakdown"] = list(trajectory.breakdown.items())
        row["metrics"] = list(trajectory.metrics.items())
        rows.append(row)
    path = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    assert load_trajectories(path) == [rich_trajectory(), bare_trajectory()]
