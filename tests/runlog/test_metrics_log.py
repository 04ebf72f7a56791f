import json
import math

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ponder.runlog.metrics_log import MetricsLog, read_metrics


def _write_steps(run_dir, steps, tensorboard=False):
    with MetricsLog(run_dir, tensorboard=tensorboard) as log:
        for step in steps:
            log.log(step, {"reward/mean": step / 10, "time/generation_s": 2.0 * step})


def test_logged_steps_read_back_exactly(tmp_path):
    _write_steps(tmp_path, range(1, 6))
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["reward/mean"] for r in records] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert [r["time/generation_s"] for r in records] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert all(isinstance(r["time"], float) for r in records)
    assert records[0]["time"] <= records[-1]["time"]


def test_numpy_torch_and_bool_values_become_floats(tmp_path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"a": np.float32(0.5), "b": torch.tensor(3), "c": True, "phase": "warmup"})
    (record,) = read_metrics(tmp_path)
    assert (record["a"], record["b"], record["c"], record["phase"]) == (0.5, 3.0, 1.0, "warmup")


def test_nan_and_inf_are_written_as_null_and_read_as_nan(tmp_path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"policy/kl": float("nan"), "optim/grad_norm": float("inf"), "loss/policy": 0.25})
    line = (tmp_path / "metrics.jsonl").read_text()
    raw = json.loads(line)  # standard JSON: no NaN/Infinity tokens
    assert raw["policy/kl"] is None and raw["optim/grad_norm"] is None
    (record,) = read_metrics(tmp_path)
    assert math.isnan(record["policy/kl"]) and math.isnan(record["optim/grad_norm"])
    assert record["loss/policy"] == 0.25


def test_reserved_and_nested_values_are_rejected(tmp_path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        with pytest.raises(ValueError, match="reserved"):
            log.log(1, {"step": 3.0})
        with pytest.raises(TypeError, match="'reward' must be a number"):
            log.log(1, {"reward": {"em": 1.0}})


def test_truncate_after_keeps_steps_up_to_the_checkpoint(tmp_path):
    _write_steps(tmp_path, range(1, 8))
    assert MetricsLog.truncate_after(tmp_path, 3) == 3
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert MetricsLog.truncate_after(tmp_path / "missing", 3) == 0


def test_partial_trailing_line_is_dropped_by_read_and_truncate(tmp_path):
    _write_steps(tmp_path, range(1, 5))
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 5, "time": 1.0, "reward/me')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert MetricsLog.truncate_after(tmp_path, 10) == 4
    assert (tmp_path / "metrics.jsonl").read_text().endswith("}\n")


def test_reopening_after_a_kill_does_not_glue_lines(tmp_path):
    _write_steps(tmp_path, [1])
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 2, "ti')
    _write_steps(tmp_path, [2])
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [(1, 0.1), (2, 0.2)]


def test_broken_line_in_the_middle_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(tmp_path)


def _scalars(tb_dir, tag):
    accumulator = EventAccumulator(str(tb_dir))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_tensorboard_mirrors_scalars_with_group_tags(tmp_path):
    _write_steps(tmp_path, [1, 2, 3], tensorboard=True)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert _scalars(tmp_path / "tb", "reward/mean") == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)),
                                                       (3, pytest.approx(0.3))]
    assert _scalars(tmp_path / "tb", "time/generation_s")[-1] == (3, 6.0)


def test_resume_truncates_jsonl_and_hides_stale_tensorboard_steps(tmp_path):
    _write_steps(tmp_path, range(1, 8), tensorboard=True)  # killed after 7, checkpoint at 5
    with MetricsLog(tmp_path, tensorboard=True, resume_step=5) as log:
        for step in (6, 7):
            log.log(step, {"reward/mean": 1.0 + step})
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [
        (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.5), (6, 7.0), (7, 8.0)]
    steps_values = _scalars(tmp_path / "tb", "reward/mean")
    assert [step for step, _ in steps_values] == [1, 2, 3, 4, 5, 6, 7]
    assert steps_values[-1][1] == 8.0


def test_log_after_close_raises(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    log.close()
    log.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        log.log(1, {"a": 1.0})
