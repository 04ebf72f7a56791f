"""`ponder bench-agent`'s sample log: a rerun starts fresh, and a finished run leaves no
partial file behind."""

import json
from pathlib import Path

import pytest

from ponder.eval.bench_agent import PARTIAL_SAMPLES, SAMPLES, sample_log
from ponder.eval.bfcl.adapter import BfclSample
from ponder.bfcl.data import DEFAULT_VENV
from ponder.eval.bfcl.suite import _append

VENV = Path(__file__).resolve().parents[2] / DEFAULT_VENV


def scored(*ids):
    return [BfclSample(id=i, category="simple_python", sample=0, text="[f(x=1)]", valid=True, error_type="",
                       calls=[{"f": {"x": 1}}], needed=["f"], offered=["f"], reference="", seconds=0.1)
            for i in ids]


def logged_ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_a_finished_run_replaces_a_stale_partial_file_and_leaves_none(tmp_path):
    # An earlier run died after logging two samples.
    _append(tmp_path / PARTIAL_SAMPLES, "BFCL functions", scored("old_0", "old_1"))
    said = []
    with sample_log(tmp_path, said.append) as log:
        assert log == tmp_path / PARTIAL_SAMPLES and not log.exists()
        _append(log, "BFCL functions", scored("new_0"))  # how the suite logs each category
        _append(log, "BFCL functions", scored("new_1"))
    assert logged_ids(tmp_path / SAMPLES) == ["new_0", "new_1"]
    assert not (tmp_path / PARTIAL_SAMPLES).exists()
    assert said == [f"removed {tmp_path / PARTIAL_SAMPLES}, left by an earlier run that did not finish "
                    "(a new run starts fresh)"]


def test_a_failed_run_keeps_its_partial_file_and_the_last_finished_samples(tmp_path):
    with sample_log(tmp_path) as log:
        _append(log, "BFCL functions", scored("first_0"))
    with pytest.raises(KeyboardInterrupt), sample_log(tmp_path) as log:
        _append(log, "BFCL functions", scored("second_0"))
        raise KeyboardInterrupt
    assert logged_ids(tmp_path / PARTIAL_SAMPLES) == ["second_0"]
    assert logged_ids(tmp_path / SAMPLES) == ["first_0"]


@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason=f"no bfcl-eval venv at {VENV}")
def test_bench_agent_twice_logs_each_sample_once(tmp_path, capsys):
    from ponder.cli import main

    argv = ["bench-agent", "--model", "oracle", "--categories", "simple_python", "--per-category", "3",
            "--bfcl-venv", str(VENV), "--out", str(tmp_path)]
    (tmp_path / PARTIAL_SAMPLES).write_text('{"id": "stale"}\n')
    assert main(argv) == 0 and main(argv) == 0
    capsys.readouterr()
    ids = logged_ids(tmp_path / SAMPLES)
    assert len(ids) == len(set(ids)) == 3 and "stale" not in ids
    assert not (tmp_path / PARTIAL_SAMPLES).exists()
