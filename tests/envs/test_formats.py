"""Task sources in the field's shapes (ponder.envs.formats): a column mapping and a
transform on hand-built datasets, a `datasets` dataset from the local cache, verl's RL
Parquet and TRL's prompt datasets written by their own conventions, and each bad input
as one line naming the file, row and column."""

from __future__ import annotations

import json
import os

import datasets
import pytest

from ponder.config import load_recipe
from ponder.envs.base import load_tasks_from
from ponder.envs.formats import TaskSource, detect_format
from ponder.envs.taskfile import TaskFileError
from ponder.types import Task
from ponder.wiring import build_env

GSM_ROWS = [
    {"problem": "Mia has 7 pens and buys 5 more. How many pens?", "solution": "7 + 5 = 12.\n#### 12", "level": 1,
     "uid": 101},
    {"problem": "What is 6 * 7?", "solution": 42, "level": 2, "uid": 102},
]  # fmt: skip
MAPPING = {"question": "problem", "answers": "solution", "kind": "level", "id": "uid"}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


# --- column mapping ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved"])
def test_a_column_mapping_reads_a_dataset_with_its_own_names(tmp_path, kind):
    if kind == "jsonl":
        source = _jsonl(tmp_path / "gsm.jsonl", GSM_ROWS)
    else:  # datasets wants one type per column: the number answer as text
        rows = [{**row, "solution": str(row["solution"])} for row in GSM_ROWS]
        source = tmp_path / ("gsm.parquet" if kind == "parquet" else "saved")
        dataset = datasets.Dataset.from_list(rows)
        dataset.to_parquet(str(source)) if kind == "parquet" else dataset.save_to_disk(str(source))
    tasks = load_tasks_from(source, TaskSource(MAPPING))
    assert [(t.id, t.question, t.answers, t.kind) for t in tasks] == [
        ("101", GSM_ROWS[0]["problem"], ["7 + 5 = 12.\n#### 12"], "1"),
        ("102", "What is 6 * 7?", ["42"], "2"),
    ]
    # the dataset's columns stay in the task, as metadata
    assert tasks[1].metadata == {"problem": "What is 6 * 7?", "solution": "42" if kind != "jsonl" else 42,
                                 "level": 2, "uid": 102}  # fmt: skip


def test_nested_columns_oracles_and_numbered_rows(tmp_path):
    rows = [{"q": {"text": "2+2?"}, "gold": [4, "four"], "worked": "2 + 2 = 4\n#### 4"}]
    source = _jsonl(tmp_path / "nested.jsonl", rows)
    (task,) = load_tasks_from(source, TaskSource({"question": "q.text", "answers": "gold", "oracle_actions": "worked"}))
    assert (task.id, task.question, task.answers, task.oracle_actions) == ("nested-0", "2+2?", ["4", "four"],
                                                                           ["2 + 2 = 4\n#### 4"])  # fmt: skip


def test_a_mapped_column_missing_names_the_file_and_the_column(tmp_path):
    source = _jsonl(tmp_path / "gsm.jsonl", GSM_ROWS)
    with pytest.raises(TaskFileError) as err:
        load_tasks_from(source, TaskSource({**MAPPING, "question": "prompt"}))
    assert _one_line(err) == (f"{source}:1: no column 'prompt' (env.columns.question); the row has level, problem, "
                              "solution, uid")  # fmt: skip


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("problem", ["a", "list"], "column 'problem' (env.columns.question) holds list, want text"),
        ("solution", {"value": 12}, "column 'solution' (env.columns.answers) holds dict, want text, a number or a "
                                    "list of them"),  # fmt: skip
        ("level", [1], "column 'level' (env.columns.kind) holds list, want text or a number"),
        ("solution", True, "column 'solution' (env.columns.answers) holds bool"),
    ],
)
def test_a_wrong_typed_column_names_the_file_row_and_column(tmp_path, column, value, message):
    rows = [dict(GSM_ROWS[0]), {**GSM_ROWS[1], column: value}]  # JSONL: any type in any row
    with pytest.raises(TaskFileError) as err:
        load_tasks_from(_jsonl(tmp_path / "bad.jsonl", rows), TaskSource(MAPPING))
    assert _one_line(err).startswith(f"{tmp_path / 'bad.jsonl'}:2: {message}")


def test_an_unknown_field_or_format_is_refused():
    with pytest.raises(ValueError, match="env.columns: unknown task field 'answer'; valid: id, question"):
        TaskSource({"answer": "solution"})
    with pytest.raises(ValueError, match="env.format: want one of auto, ponder, verl, trl"):
        TaskSource(format="csv")


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved split"])
def test_an_empty_split_is_one_line(tmp_path, kind):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind == "jsonl":
        source = str(_jsonl(tmp_path / "empty.jsonl", []))
    elif kind == "parquet":
        source = str(tmp_path / "empty.parquet")
        pq.write_table(pa.table({"problem": pa.array([], pa.string())}), source)
    else:  # a DatasetDict saved with an empty test split; each split is a datasets directory
        splits = {"train": datasets.Dataset.from_dict({"problem": ["x"]}),
                  "test": datasets.Dataset.from_dict({"problem": []})}  # fmt: skip
        datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "saved"))
        source = str(tmp_path / "saved" / "test")
    with pytest.raises(TaskFileError) as err:
        load_tasks_from(source, TaskSource(MAPPING))
    assert _one_line(err) == f"{source}: no rows (an empty file or split)"


# --- transforms ---------------------------------------------------------------------------

TRANSFORMS = '''
def gold_after_hashes(row):
    if row["level"] > 1:
        return None  # keep level 1 only
    return {**row, "gold": str(row["solution"]).rsplit("####", 1)[-1].strip()}

def breaks(row):
    return row["nope"]

def gives_text(row):
    return "row"
'''


@pytest.fixture
def transforms(tmp_path, monkeypatch):
    (tmp_path / "my_transforms.py").write_text(TRANSFORMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_transforms"


def test_a_transform_sees_the_dataset_row_and_may_drop_rows(tmp_path, transforms):
    source = _jsonl(tmp_path / "gsm.jsonl", GSM_ROWS)
    spec = TaskSource({"question": "problem", "answers": "gold"}, f"{transforms}:gold_after_hashes")
    (task,) = load_tasks_from(source, spec)
    assert (task.id, task.answers, task.metadata["solution"]) == ("gsm-0", ["12"], "7 + 5 = 12.\n#### 12")


def test_a_failing_transform_names_the_row(tmp_path, transforms):
    source = _jsonl(tmp_path / "gsm.jsonl", GSM_ROWS)
    with pytest.raises(TaskFileError) as err:
        load_tasks_from(source, TaskSource(MAPPING, f"{transforms}:breaks"))
    assert _one_line(err) == f"{source}:1: env.transform {transforms}:breaks failed (KeyError: 'nope')"
    with pytest.raises(TaskFileError) as err:
        load_tasks_from(source, TaskSource(MAPPING, f"{transforms}:gives_text"))
    assert _one_line(err) == f"{source}:1: env.transform {transforms}:gives_text returned str, not a row dict"
    with pytest.raises(ValueError, match="env.transform 'my_transforms:absent': my_transforms has no attribute"):
        load_tasks_from(source, TaskSource(MAPPING, f"{transforms}:absent"))


# --- hf:NAME[:CONFIG]:SPLIT, offline --------------------------------------------------------


def _cache_like_a_download(cache, name, config, rows, tmp_path):
    """What `load_dataset(name, config)` leaves in the cache when it downloads: the
    prepared Arrow split under NAME/CONFIG/VERSION/HASH, built here by datasets' own
    JSON builder from a local file (no network)."""
    from datasets.packaged_modules.json.json import Json

    data = _jsonl(tmp_path / "download.jsonl", rows)
    builder = Json(cache_dir=str(cache), dataset_name=name, config_name=config, data_files={"train": str(data)},
                   hash="0123abcd")  # fmt: skip
    builder.download_and_prepare()
    built = os.path.dirname(os.path.dirname(builder.cache_dir))  # CONFIG-<data files hash>/
    os.rename(built, os.path.join(os.path.dirname(built), config))


def test_a_dataset_in_the_local_cache_loads_by_name_offline(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _cache_like_a_download(cache, "gsm_style", "main", GSM_ROWS[:1], tmp_path)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    tasks = load_tasks_from("hf:gsm_style:main:train", TaskSource(MAPPING))
    assert [(t.id, t.answers) for t in tasks] == [("101", ["7 + 5 = 12.\n#### 12"])]
    with pytest.raises(TaskFileError) as err:
        load_tasks_from("hf:gsm_style:main:test", TaskSource(MAPPING))
    assert _one_line(err).startswith("hf:gsm_style:main:test: cannot load it offline (Unknown split \"test\"")
    with pytest.raises(TaskFileError) as err:  # never downloaded: refused, not fetched
        load_tasks_from("hf:someone/absent_dataset:train", TaskSource(MAPPING))
    assert "cannot load it offline" in _one_line(err) and "only a dataset already in the local cache" in str(err.value)
    assert datasets.config.HF_HUB_OFFLINE is bool(datasets.config.HF_HUB_OFFLINE)  # restored, still a bool


def test_a_local_directory_of_data_files_loads_by_split(tmp_path):
    (tmp_path / "mine").mkdir()
    _jsonl(tmp_path / "mine" / "train.jsonl", GSM_ROWS[:1])
    _jsonl(tmp_path / "mine" / "test.jsonl", GSM_ROWS[1:])
    tasks = load_tasks_from(f"hf:{tmp_path / 'mine'}:test[:1]", TaskSource(MAPPING))
    assert [(t.id, t.question) for t in tasks] == [("102", "What is 6 * 7?")]
    with pytest.raises(TaskFileError, match="want hf:NAME"):
        load_tasks_from("hf:only-a-name", TaskSource(MAPPING))


# --- verl's RL Parquet ------------------------------------------------------------------------

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def verl_rows(problems):
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": "train", "index": index, "answer": f"... #### {answer}", "question": question},
        }
        for index, (question, answer) in enumerate(problems)
    ]


def test_a_verl_parquet_file_reads_as_it_is(tmp_path):
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(verl_rows([("What is 6 * 7?", "42"), ("What is 2 + 3?", "5")])).to_parquet(str(path))
    for spec in (None, TaskSource(format="verl")):  # detected by its columns, or named
        tasks = load_tasks_from(path, spec)
        assert [(t.id, t.question, t.answers, t.kind) for t in tasks] == [
            ("train-0", f"What is 6 * 7? {INSTRUCTION}", ["42"], "openai/gsm8k"),
            ("train-1", f"What is 2 + 3? {INSTRUCTION}", ["5"], "openai/gsm8k"),
        ]
    assert tasks[0].metadata["messages"] == [{"role": "user", "content": f"What is 6 * 7? {INSTRUCTION}"}]
    assert tasks[0].metadata["columns"]["reward_model"] == {"style": "rule", "ground_truth": "42"}
    assert tasks[1].metadata["columns"]["extra_info"]["index"] == 1


def test_a_verl_row_without_ground_truth_names_the_file_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = verl_rows([("What is 6 * 7?", "42"), ("What is 2 + 3?", "5")])
    rows[1]["reward_model"]["ground_truth"] = None
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TaskFileError) as err:
        load_tasks_from(path)
    assert _one_line(err) == f"{path}:row 2: verl row has no reward_model.ground_truth"


def test_a_verl_prompt_that_is_not_chat_messages_is_refused(tmp_path):
    rows = verl_rows([("What is 6 * 7?", "42")])
    rows[0]["prompt"] = "What is 6 * 7?"
    with pytest.raises(TaskFileError) as err:
        load_tasks_from(_jsonl(tmp_path / "v.jsonl", rows))
    assert _one_line(err) == f"{tmp_path / 'v.jsonl'}:1: verl 'prompt' must be a list of chat messages, got str"


# --- TRL's prompt-only and conversational datasets ----------------------------------------------


def test_a_trl_prompt_only_dataset_keeps_its_columns(tmp_path):
    rows = [{"prompt": "What is 6 * 7?", "solution": "42", "source": "mine"},
            {"prompt": "What is 2 + 3?", "solution": "5", "source": "mine"}]  # fmt: skip
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "trl"))
    tasks = load_tasks_from(tmp_path / "trl", TaskSource({"answers": "solution"}))
    assert [(t.id, t.question, t.answers) for t in tasks] == [("trl-0", "What is 6 * 7?", ["42"]),
                                                              ("trl-1", "What is 2 + 3?", ["5"])]  # fmt: skip
    assert tasks[0].metadata == {"prompt": "What is 6 * 7?", "columns": {"solution": "42", "source": "mine"}}


def test_a_trl_conversational_dataset_with_completions(tmp_path):
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 * 7?"}]
    rows = [{"prompt": prompt, "completion": [{"role": "assistant", "content": "#### 42"}], "answer": 42}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "conv.parquet"))
    assert detect_format(rows[0]) == "trl"
    (task,) = load_tasks_from(tmp_path / "conv.parquet", TaskSource({"answers": "answer"}))
    assert (task.question, task.answers, task.oracle_actions) == ("What is 6 * 7?", ["42"], ["#### 42"])
    assert task.metadata["messages"] == prompt and task.metadata["columns"] == {"answer": 42}


def test_recipe_keys_reach_the_task_files(tmp_path):
    source = _jsonl(tmp_path / "gsm.jsonl", GSM_ROWS)
    columns = "{question: problem, answers: solution, kind: level, id: uid}"
    recipe = load_recipe(None, ["env.kind=verified_qa", f"env.train_tasks={source}", f"env.eval_tasks={source}",
                                f"env.columns={columns}", "env.format=ponder"])  # fmt: skip
    spec = build_env(recipe)
    assert [t.id for t in spec.train] == [t.id for t in spec.eval] == ["101", "102"]
    assert spec.eval[1] == Task("102", "What is 6 * 7?", ["42"], kind="2", metadata=GSM_ROWS[1])
