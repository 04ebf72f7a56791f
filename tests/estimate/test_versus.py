"""`ponder estimate --versus RUN_DIR`: predicted against what a run recorded. A real
tiny demo (which now records each stage's peak memory), and a run directory written
by hand whose every number is known."""

import json

import pytest

from ponder.cli import main
from ponder.config import load_recipe, save_recipe
from ponder.estimate import build_estimate
from ponder.estimate.versus import compare, read_run

TINY = ["model.name=tiny", "env.max_turns=2", "env.options.max_obs_tokens=16", "env.options.taskgen.n_people=20",
        "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "rollout.group_size=2", "rollout.batch_size=4",
        "rollout.sampling.max_new_tokens_per_turn=16", "lora.r=4", "sft.steps=1", "sft.batch_size=2",
        "sft.examples=2", "train.steps=2", "train.tasks_per_step=2", "train.save_every=2", "algo.micro_batch_size=2",
        "eval.episodes=2"]  # fmt: skip


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PONDER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from ponder.jobs.demo import run_demo

    out = tmp_path_factory.mktemp("versus") / "demo"
    run_demo(load_recipe(None, TINY), out, say=lambda _: None, skip_oracle=True)
    return out


def test_a_demo_records_each_stages_peak(demo):
    results = json.loads((demo / "results.json").read_text())
    peaks = results["memory/peak_gb"]
    assert set(peaks) == {"eval:base", "sft", "eval:sft", "rl", "eval:rl"}
    assert all(0 < peak["rss"] < 100 for peak in peaks.values())
    assert peaks["eval:base"]["rss"] <= peaks["sft"]["rss"] <= peaks["rl"]["rss"]  # the process's peak so far


def test_versus_a_real_run(demo, capsys):
    assert main(["estimate", "--versus", str(demo), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {row["row"]: row for row in out["rows"]}
    for label in ("RL rollouts, per step", "RL update, per step", "SFT warm-up", "RL run", "one evaluation",
                  "process peak of the RL steps", "process peak by the end of sft"):  # fmt: skip
        assert label in rows and rows[label]["measured"] > 0
    row = rows["RL run"]
    assert row["error_pct"] == pytest.approx(100 * (row["predicted"] - row["measured"]) / row["measured"])
    assert "RL steps" in out["estimate"]["tokens"]["source"]  # the run's own token counts
    assert out["estimate"]["tokens"]["episode"] < 1024  # not the cap
    assert main(["estimate", "--versus", str(demo), "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    words = " ".join(table.split())  # the title folds at 80 columns after a long run path
    assert "predicted vs measured" in words and "error" in table and "%" in table
    assert all(len(line) <= 80 for line in table.splitlines())


def _write_run(run, recipe):
    run.mkdir()
    save_recipe(recipe, run / "recipe.yaml")
    (run / "results.json").write_text(json.dumps({
        "timing_s": {"eval:base": 4.0, "sft": 10.0, "eval:sft": 5.0, "rl": 20.0, "eval:rl": 6.0, "total": 45.0},
        "memory/peak_gb": {"eval:base": {"rss": 1.0}, "sft": {"rss": 2.0}, "rl": {"rss": 3.0}},
    }))  # fmt: skip
    (run / "rl").mkdir()
    steps = [{"step": i + 1, "time": 0.0, "time/generation_s": g, "time/logprob_s": 0.0, "time/update_s": 0.5,
              "memory/rollout_peak_gb": 2.5, "memory/peak_gb": 3.0, "episode/response_tokens": 90.0,
              "episode/generated_tokens": 30.0} for i, g in enumerate((1.0, 3.0, 2.0))]  # fmt: skip
    (run / "rl" / "metrics.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))


def test_versus_by_hand(tmp_path):
    recipe = load_recipe(None, TINY)
    _write_run(tmp_path / "run", recipe)
    measured = read_run(tmp_path / "run")
    assert measured.times == {"rollout_s": 2.0, "no_grad_s": 0.0, "update_s": 0.5, "sft_s": 10.0, "rl_s": 20.0,
                              "eval_s": 5.0}  # medians over the steps, the mean of the evaluations  # fmt: skip
    assert (measured.tokens.episode, measured.tokens.decode) == (90, 30)  # no saved episodes: no prompt length
    estimate = build_estimate(recipe, "cpu", tokens=measured.tokens)
    rows = {row.label: row for row in compare(estimate, measured)}
    assert rows["RL rollouts, per step"].predicted == estimate.value("rollout_s")
    assert rows["RL rollouts, per step"].error_pct == pytest.approx(100 * (estimate.value("rollout_s") - 2) / 2)
    assert "RL no-grad passes, per step" not in rows  # the estimate runs none here
    peak = rows["process peak by the end of sft"]
    assert peak.measured == 2e9 and peak.predicted == max(estimate.value("peak_eval"), estimate.value("peak_sft"))
    rollouts = rows["process peak as the RL rollouts end"]
    assert rollouts.measured == 2.5e9
    assert rollouts.predicted == max(estimate.value(k) for k in ("peak_eval", "peak_sft", "peak_rollout"))
    on_gpu = compare(build_estimate(recipe, "h100", tokens=measured.tokens), measured)
    assert [row.unit for row in on_gpu] == ["s"] * len(on_gpu)  # RSS is host memory: not a GPU's peak


def test_versus_needs_a_run_directory(tmp_path, capsys):
    assert main(["estimate", "--versus", str(tmp_path)]) == 2
    assert "no recipe.yaml" in capsys.readouterr().err
