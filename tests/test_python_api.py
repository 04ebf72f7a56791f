"""The Python API (`from ponder.api import load_recipe, train, evaluate, serve`): the
guide's example, examples/python_api.py, runs end to end on the tiny model."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ponder import api

EXAMPLE = Path(__file__).parents[1] / "examples" / "python_api.py"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_example_trains_evaluates_and_serves(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    run_dir = tmp_path / "run"
    command = [sys.executable, str(EXAMPLE), str(run_dir), "--tiny", "--port", str(_free_port())]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    reward = re.search(r"held-out reward: (\d\.\d{3}) before, (\d\.\d{3}) after training", done.stdout)
    assert reward is not None, done.stdout
    assert "served the trained model; it said:" in done.stdout
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the recipe's train.steps, after its SFT warm-up
    assert (run_dir / "sft").is_dir()


def test_load_recipe_applies_overrides_and_validates():
    assert api.load_recipe(None, ["train.steps=3"]).train.steps == 3
    with pytest.raises(ValueError, match="train.steps"):
        api.load_recipe(None, ["train.steps=many"])


def test_a_bad_recipe_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="unknown advantage estimator .gpro.; valid: .*grpo"):
        api.train(api.load_recipe(None), tmp_path / "r", ["algo.advantage=gpro"])
    assert not (tmp_path / "r").exists()
