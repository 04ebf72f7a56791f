"""`ponder export-data` (ponder.data.export, ponder.jobs.export_data): a run's episodes,
SFT and DPO data and tasks written in TRL's and verl's layouts, each read back with
`datasets` (as TRL and verl load them) and by ponder's own readers; bad input as one line."""

from __future__ import annotations

import json

import datasets
import pytest

from ponder.cli import main
from ponder.config import RolloutConfig, SamplingConfig, load_recipe, save_recipe
from ponder.data.export import LAYOUTS, ExportRecords, chat, write_rows
from ponder.data.records import Conversation, DataError
from ponder.envs.base import load_tasks_from
from ponder.envs.formats import TaskSource
from ponder.jobs.export_data import export_data
from ponder.models import tiny_tokenizer
from ponder.rewards import score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.types import save_trajectories
from ponder.wiring import build_env, build_reward

ROWS = [{"question": "What is 6 * 7?", "answer": "6 * 7 = 42.\n#### 42"},
        {"question": "What is 2 + 3?", "answer": "2 + 3 = 5.\n#### 5"}]  # fmt: skip
OPENING = "Solve the problem step by step, then write the final answer on the last line after '####', e.g. #### 42."


def _read(path):
    """The file as TRL and verl load it: a `datasets` Dataset (Parquet or JSON)."""
    kind = "parquet" if path.suffix == ".parquet" else "json"
    return datasets.load_dataset(kind, data_files=str(path), split="train").to_list()


@pytest.fixture
def run(tmp_path):
    """A run directory as `ponder eval` leaves it: recipe.yaml and trajectories.parquet,
    two episodes per task (one right, one wrong), scored by the recipe's reward."""
    tasks = tmp_path / "gsm.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    recipe = load_recipe(None, ["env.kind=verified_qa", f"env.train_tasks={tasks}", f"env.eval_tasks={tasks}",
                                "env.columns={answers: answer}", "env.options={extract: gsm8k, gold_extract: gsm8k}"])
    spec = build_env(recipe)
    replies = {"gsm-0": ["6 * 7 = 42\n#### 42", "#### 41"], "gsm-1": ["#### 4", "2 + 3 = 5\n#### 5"]}
    scripts = {task_id: [replies[task_id].pop(0)] for task_id in replies}
    rollout = RolloutConfig(group_size=1, batch_size=2, sampling=SamplingConfig(max_new_tokens_per_turn=64))
    first, _ = RolloutEngine(ScriptedBackend(tiny_tokenizer(), scripts), spec.factory, rollout).run(spec.eval)
    scripts = {task_id: [replies[task_id].pop(0)] for task_id in replies}
    second, _ = RolloutEngine(ScriptedBackend(tiny_tokenizer(), scripts), spec.factory, rollout).run(spec.eval)
    trajectories = first + second
    score_trajectories(trajectories, {t.id: t for t in spec.eval}, build_reward(recipe, spec))
    assert [t.reward for t in trajectories] == [1.0, 0.0, 0.0, 1.0]
    out = tmp_path / "run"
    out.mkdir()
    save_trajectories(trajectories, out / "trajectories.parquet")
    save_recipe(recipe, out / "recipe.yaml")
    return out


def test_episodes_export_as_trl_conversations_and_preferences(run, tmp_path):
    out = tmp_path / "sft.parquet"
    assert export_data(str(run), "trl-messages", str(out), min_reward=1.0) == 2
    prompt = [{"role": "system", "content": OPENING}, {"role": "user", "content": "What is 6 * 7?"}]
    first, second = _read(out)
    assert first == {"messages": [*prompt, {"role": "assistant", "content": "6 * 7 = 42\n#### 42"}]}
    assert second["messages"][-1] == {"role": "assistant", "content": "2 + 3 = 5\n#### 5"}
    assert export_data(str(run), "trl-prompt-completion", str(tmp_path / "pc.jsonl")) == 4  # every answered one
    assert _read(tmp_path / "pc.jsonl")[0] == {"prompt": prompt, "completion": [first["messages"][-1]]}
    assert export_data(str(run / "trajectories.parquet"), "trl-preference", str(tmp_path / "dpo.parquet")) == 2
    pair = _read(tmp_path / "dpo.parquet")[0]
    assert pair == {"prompt": prompt, "chosen": [{"role": "assistant", "content": "6 * 7 = 42\n#### 42"}],
                    "rejected": [{"role": "assistant", "content": "#### 41"}]}  # fmt: skip


def test_episodes_export_as_verl_sft(run, tmp_path):
    out = tmp_path / "verl_sft.parquet"
    assert export_data(str(run), "verl-sft", str(out), min_reward=1.0, data_source="mine") == 2
    row = _read(out)[0]
    assert row["data_source"] == "mine" and row["extra_info"] == {"split": "train", "index": 0, "id": "gsm-0:gsm-0"}
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]


def test_tasks_round_trip_through_verl_and_trl_layouts(run, tmp_path):
    recipe = str(run / "recipe.yaml")
    tasks = build_env(load_recipe(recipe)).eval
    verl = tmp_path / "verl.parquet"
    assert export_data(None, "verl-rl", str(verl), recipe, split="eval") == 2
    row = _read(verl)[0]
    assert row["reward_model"] == {"style": "rule", "ground_truth": ROWS[0]["answer"]}
    assert row["prompt"][-1] == {"role": "user", "content": "What is 6 * 7?"} and row["data_source"] == "qa"
    assert row["extra_info"] == {"split": "eval", "index": 0, "id": "gsm-0", "question": "What is 6 * 7?",
                                 "answers": [ROWS[0]["answer"]]}  # fmt: skip
    back = load_tasks_from(verl)  # ponder reads its own export as verl data
    assert [(t.id, t.question, t.answers, t.kind) for t in back] == [(t.id, t.question, t.answers, t.kind)
                                                                     for t in tasks]  # fmt: skip
    assert back[0].metadata["messages"] == row["prompt"]
    trl = tmp_path / "trl.parquet"
    assert export_data(None, "trl-prompt", str(trl), recipe, split="eval") == 2
    assert _read(trl)[1] == {"prompt": [{"role": "system", "content": OPENING},
                                        {"role": "user", "content": "What is 2 + 3?"}],
                             "answers": [ROWS[1]["answer"]], "id": "gsm-1", "kind": "qa"}  # fmt: skip
    again = load_tasks_from(trl, TaskSource({"answers": "answers"}))
    assert [(t.id, t.question, t.answers) for t in again] == [(t.id, t.question, t.answers) for t in tasks]


def test_sft_and_dpo_data_files_convert(tmp_path):
    sft = tmp_path / "sft.jsonl"
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}}
    messages = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "42"}, {"role": "assistant", "content": "42"}]
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]  # fmt: skip
    sft.write_text(json.dumps({"messages": messages, "tools": tools}) + "\n")
    assert export_data(str(sft), "trl-messages", str(tmp_path / "m.parquet")) == 1
    (row,) = _read(tmp_path / "m.parquet")
    assert row["messages"][1]["tool_calls"] == [{"type": "function", "function": {
        "name": "calculator", "arguments": '{"expression": "6*7"}'}}]  # fmt: skip
    dpo = tmp_path / "dpo.jsonl"
    dpo.write_text(json.dumps({"prompt": "6*7?", "chosen": "42", "rejected": "41"}) + "\n")
    assert export_data(str(dpo), "trl-preference", str(tmp_path / "p.jsonl")) == 1
    assert _read(tmp_path / "p.jsonl") == [{"prompt": [{"role": "user", "content": "6*7?"}],
                                            "chosen": [{"role": "assistant", "content": "42"}],
                                            "rejected": [{"role": "assistant", "content": "41"}]}]  # fmt: skip
    with pytest.raises(DataError, match="trl-prompt: nothing to export: the source has no tasks"):
        export_data(str(dpo), "trl-prompt", str(tmp_path / "x.jsonl"))


def test_writes_are_atomic_and_every_layout_is_registered(tmp_path):
    assert LAYOUTS.names() == ["trl-messages", "trl-preference", "trl-prompt", "trl-prompt-completion", "verl-rl",
                               "verl-sft"]  # fmt: skip
    out = tmp_path / "rows.parquet"
    write_rows([{"a": 1}], out)
    with pytest.raises(DataError) as err:  # rows Parquet cannot hold: the old file stays, no temp file is left
        write_rows([{"a": 1}, {"a": [1, 2]}], out)
    assert str(err.value).startswith(f"{out}: the rows do not fit one Parquet schema (") and "\n" not in str(err.value)
    assert _read(out) == [{"a": 1}] and [p.name for p in tmp_path.iterdir()] == ["rows.parquet"]
    with pytest.raises(DataError, match="write .parquet or .jsonl"):
        write_rows([{"a": 1}], tmp_path / "rows.csv")
    conversation = Conversation([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}])
    assert chat(conversation.messages)[1] == {"role": "assistant", "content": ""}
    with pytest.raises(DataError, match="verl-rl: nothing to export"):
        LAYOUTS.get("verl-rl")(ExportRecords())


def test_the_command_line(run, tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    assert main(["export-data", str(run), "--layout", "trl-messages", "--out", str(out), "--min-reward", "1"]) == 0
    assert len(_read(out)) == 2 and "wrote 2 rows (trl-messages)" in capsys.readouterr().err
    (run / "recipe.yaml").unlink()
    assert main(["export-data", str(run), "--layout", "trl-messages", "--out", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("no recipe.yaml beside the trajectories; give the run's recipe with --recipe")
    assert not (tmp_path / "x.parquet").exists()
