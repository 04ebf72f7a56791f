"""`ponder demo --resume`: a demo stopped part-way reuses the stages it measured (the
oracle's and the base model's evaluations, the SFT warm-up and its evaluation) and
runs only what is missing; `--skip-oracle` leaves the oracle's evaluation out."""

import json

import pytest

import ponder.jobs.demo as demo
from ponder.cli import main
from ponder.config import load_recipe
from ponder.fileio import dumps_strict
from ponder.jobs.demo import run_demo
from ponder.jobs.demo_table import demo_table
from ponder.rundir import RunDirError
from tests.jobs.test_demo import TINY


def test_resume_after_a_stop_during_rl_reuses_every_measured_stage(tmp_path, monkeypatch):
    out = tmp_path / "demo"
    recipe = load_recipe(None, TINY)

    def stopped(*_args, **_kwargs):
        raise KeyboardInterrupt  # the kill, once the evaluations and the warm-up are done

    with monkeypatch.context() as patch:
        patch.setattr(demo, "_train_rl", stopped)
        with pytest.raises(KeyboardInterrupt):
            run_demo(recipe, out, say=lambda _: None)
    measured = json.loads((out / demo.STAGES_FILE).read_text())
    assert set(measured["stages"]) == {"oracle", "base", "sft"} and not (out / "results.json").exists()

    evaluated = []
    real_evaluate = demo.evaluate

    def counted(*args, **kwargs):
        evaluated.append("oracle" if kwargs.get("oracle") else "model")
        return real_evaluate(*args, **kwargs)

    def no_warm_up(*_args, **_kwargs):
        raise AssertionError("the finished warm-up was run again")

    monkeypatch.setattr(demo, "evaluate", counted)
    monkeypatch.setattr(demo, "warm_up", no_warm_up)
    said = []
    results = run_demo(load_recipe(None, TINY), out, say=said.append, resume=True)
    assert evaluated == ["model"]  # RL's evaluation alone
    assert set(results["stages"]) == {"oracle", "base", "sft", "rl"} and "rl_gain" in results
    for stage in ("oracle", "base", "sft"):
        assert dumps_strict(results["stages"][stage], sort_keys=True) == dumps_strict(measured["stages"][stage],
                                                                                       sort_keys=True)  # fmt: skip
        assert any(line.startswith(f"eval {stage}: reward") and "reused" in line for line in said)
    assert (out / "results.json").is_file() and (out / "rl" / "checkpoints" / "latest").is_file()

    # a finished demo resumed: nothing runs again, the same table
    evaluated.clear()
    monkeypatch.setattr(demo, "_train_rl", stopped)
    again = run_demo(load_recipe(None, TINY), out, say=lambda _: None, resume=True)
    assert evaluated == [] and dumps_strict(again["stages"], sort_keys=True) == dumps_strict(results["stages"],
                                                                                                sort_keys=True)  # fmt: skip

    with pytest.raises(RunDirError, match=r"changed recipe: eval\.episodes: 4 -> 3.*--sft-from"):
        run_demo(load_recipe(None, [*TINY, "eval.episodes=3"]), out, say=lambda _: None, resume=True)


def test_skip_oracle_leaves_the_oracle_out(tmp_path, monkeypatch):
    recipe = load_recipe(None, [*TINY, "sft.steps=0", "train.steps=0"])
    results = run_demo(recipe, tmp_path / "demo", say=lambda _: None, skip_oracle=True)
    assert set(results["stages"]) == {"base"} and not (tmp_path / "demo" / "eval-oracle.parquet").exists()
    demo_table(results)  # the table stands without its oracle column


def test_cli_resume_needs_a_demo_and_refuses_sft_from(tmp_path, capsys):
    assert main(["demo", "--resume", "--out", str(tmp_path / "none"), *TINY]) == 2
    assert f"ponder demo --out {tmp_path / 'none'}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--sft-from starts a new demo"):
        run_demo(load_recipe(None, TINY), tmp_path, say=lambda _: None, sft_from=tmp_path, resume=True)
    with pytest.raises(SystemExit):  # argparse: --resume or --overwrite, not both
        main(["demo", "--resume", "--overwrite"])
