"""Trackers (ponder.runlog.tracking) read back from what they wrote: TensorBoard event
files through TensorBoard's own EventAccumulator, the offline W&B run through its
`.wandb` record file; the RL trainer sends its advantages and sampled episodes."""

import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ponder.config import ConfigError, load_recipe
from ponder.runlog.metrics_log import MetricsLog, read_metrics
from ponder.runlog.tracking import check_trackers, markdown_table
from ponder.jobs.parts import rl_trainer

HOSTILE = "<script>alert(1)</script> a | b\nnext line"


def _write(run_dir, trackers):
    with MetricsLog(run_dir, trackers=trackers, config={"algo": {"advantage": "grpo"}}) as log:
        for step in (1, 2, 3):
            log.log(step, {"reward/mean": 0.25 * step, "policy/entropy": 1.5, "note": "text is JSON only"})
            log.histogram(step, "advantages", np.array([-1.0, 0.0, 0.5, float(step), float("nan")]))
        log.table(3, "samples", ["task", "response", "reward"], [["t-1", HOSTILE, 0.5], ["t-2", "ok", 1.0]])


def _accumulator(tb_dir):
    accumulator = EventAccumulator(str(tb_dir), size_guidance={"histograms": 0, "tensors": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def test_tensorboard_holds_scalars_advantage_histograms_and_the_sample_table(tmp_path):
    _write(tmp_path, ["tensorboard"])
    accumulator = _accumulator(tmp_path / "tb")
    assert [(e.step, e.value) for e in accumulator.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert "note" not in accumulator.Tags()["scalars"]
    histograms = accumulator.Histograms("advantages")
    assert [h.step for h in histograms] == [1, 2, 3]
    last = histograms[-1].histogram_value
    assert (last.num, last.min, last.max, last.sum) == (4, -1.0, 3.0, 2.5)  # the NaN left out
    text = accumulator.Tensors("samples/text_summary")[0]
    assert text.step == 3
    table = text.tensor_proto.string_val[0].decode()
    assert table.splitlines()[0] == "| task | response | reward |"
    assert "a \\| b<br>next line" in table and "| 0.5 |" in table
    # metrics.jsonl is still the source of truth, strings included
    assert [r["note"] for r in read_metrics(tmp_path)] == ["text is JSON only"] * 3


def _wandb_records(path):
    """Records of a `.wandb` file: a 7-byte W&B header, then LevelDB's log format
    (32 KiB blocks of chunks: crc32c, little-endian length, type; FULL=1, FIRST=2,
    MIDDLE=3, LAST=4) holding wandb's protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, offset, block = [], b"", 7, 32768
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        length, kind = struct.unpack("<HB", data[offset + 4 : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_wandb_runs_offline_and_its_run_file_holds_the_logged_keys(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is a test extra: pip install -e '.[test]'")
    monkeypatch.setenv("WANDB_MODE", "online")  # the tracker is offline whatever the environment says
    monkeypatch.setenv("WANDB_API_KEY", "")
    _write(tmp_path, ["wandb"])
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "one offline run directory"
    records = _wandb_records(next(runs[0].glob("run-*.wandb")))
    history: dict[int, dict] = {}  # step -> key -> value; a media value's fields nest under its key
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {tuple(item.nested_key) or (item.key,): json.loads(item.value_json) for item in record.history.item}
            row = history.setdefault(items[("_step",)], {})
            for (key, *field), value in items.items():
                row[key] = row.get(key, {}) | {field[0]: value} if field else value
    assert sorted(history) == [1, 2, 3]
    assert [history[s]["reward/mean"] for s in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert "note" not in history[1]
    for step in (1, 2, 3):  # 4 finite values of 5; the NaN left out
        assert history[step]["advantages"]["_type"] == "histogram" and sum(history[step]["advantages"]["values"]) == 4
    assert history[3]["samples"]["_type"] == "table-file" and history[3]["samples"]["nrows"] == 2
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_id == (tmp_path / "wandb" / "wandb-run-id").read_text().strip()
    tables = list(runs[0].glob("files/media/table/samples_3_*.table.json"))
    assert tables and HOSTILE.replace("\n", "\\n") in tables[0].read_text()


def test_unknown_tracker_and_missing_wandb_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown tracker 'mlflow'; valid: tensorboard, wandb"):
        check_trackers(["mlflow"])
    # wandb made unimportable in a fresh interpreter: the error says how to install it
    code = ("import sys; sys.modules['wandb'] = None\n"
            "from ponder.runlog.tracking import check_trackers\n"
            "try:\n    check_trackers(['tensorboard', 'wandb'])\nexcept ValueError as e:\n    print(e)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "tracking.trackers: wandb needs ponder[tracking]: pip install 'ponder[tracking]'"


def test_recipe_chooses_trackers_and_checks_ranges():
    recipe = load_recipe(None, ["tracking.trackers=[tensorboard, wandb]", "tracking.samples_every=2"])
    assert recipe.tracking.trackers == ["tensorboard", "wandb"] and recipe.tracking.samples_every == 2
    assert load_recipe(None).tracking.trackers == ["auto"]  # tensorboard when installed (test_auto_...)
    with pytest.raises(ConfigError, match="tracking.samples_every' must be >= 0"):
        load_recipe(None, ["tracking.samples_every=-1"])


def test_markdown_cells_escape_pipes_and_line_breaks():
    assert markdown_table(["a", "b"], [["x|y", 0.123456]]).splitlines() == ["| a | b |", "|---|---|",
                                                                           "| x\\|y | 0.1235 |"]


def test_rl_trainer_logs_advantages_and_sampled_episodes_to_tensorboard(tmp_path):

    overrides = [
        "model.name=tiny", "train.steps=2", "train.tasks_per_step=2", "rollout.group_size=2",
        "rollout.batch_size=4", "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=2",
        "env.options.max_obs_tokens=16", "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=16", "env.options.taskgen.n_eval=4",
        "lora.r=4", "algo.micro_batch_size=2", "train.save_every=2", "tracking.samples_every=2",
        "tracking.samples=3",
    ]  # fmt: skip

    def length_reward(trajectory, task):  # differs between samples: non-zero advantages
        return len(trajectory.response_ids) / 100.0, {"length": len(trajectory.response_ids) / 100.0}

    rl_trainer(load_recipe(None, overrides), tmp_path, reward=length_reward).train()
    records = read_metrics(tmp_path)
    accumulator = _accumulator(tmp_path / "tb")
    scalars = accumulator.Scalars("reward/mean")
    assert [(e.step, e.value) for e in scalars] == [(r["step"], pytest.approx(r["reward/mean"])) for r in records]
    histograms = accumulator.Histograms("advantages")
    assert [h.step for h in histograms] == [1, 2]
    assert all(h.histogram_value.num > 0 and math.isfinite(h.histogram_value.sum) for h in histograms)
    texts = accumulator.Tensors("samples/text_summary")
    assert [t.step for t in texts] == [2]
    table = texts[0].tensor_proto.string_val[0].decode().split("\n")  # model text may hold U+2028 …
    assert table[0] == "| task | question | response | reward |" and len(table) == 2 + 3
    assert os.path.isdir(tmp_path / "tb")


def test_auto_is_tensorboard_when_installed_and_nothing_otherwise(tmp_path, monkeypatch, capsys):
    from ponder.runlog import tracking

    assert tracking.resolve_trackers(["auto", "tensorboard", "wandb"]) == ["tensorboard", "wandb"]
    _write(tmp_path / "installed", ["auto"])
    assert list((tmp_path / "installed" / "tb").glob("events.out.tfevents.*"))
    monkeypatch.setattr(tracking, "available", lambda module: False)  # a core install: no tensorboard
    assert tracking.resolve_trackers(["auto"]) == []
    assert "pip install 'ponder[tracking]'" in capsys.readouterr().err
    _write(tmp_path / "core", ["auto"])
    assert (tmp_path / "core" / "metrics.jsonl").is_file() and not (tmp_path / "core" / "tb").exists()
