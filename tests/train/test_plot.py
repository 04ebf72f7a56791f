import numpy as np
import pytest
from matplotlib import pyplot as plt

from ponder.train.metrics_log import MetricsLog
from ponder.train.metrics_log import read_metrics
from ponder.train.plot import (
    plot_stages,
    _ema, _eval_records, _merge_by_step, _series, _train_records, compare_runs, plot_run,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _fake_run(run_dir, steps=12, with_eval=True, reward_scale=1.0):
    with MetricsLog(run_dir, tensorboard=False) as log:
        for step in range(1, steps + 1):
            log.log(step, {
                "reward/mean": reward_scale * step / steps, "reward/std": 0.1, "reward/em": step / steps,
                "reward/format": 0.5, "episode/searches": 1 + step % 3, "episode/turns": 2.0,
                "loss/policy": 1.0 / step, "policy/entropy": float("nan") if step == 4 else 0.7,
                "time/generation_s": 3.0, "time/update_s": 1.0, "throughput/tokens_per_s": 120.0,
            })
            if with_eval and step % 4 == 0:
                log.log(step, {"eval/em": step / 20, "eval/reward": step / 15, "time/eval_s": 5.0})
    return run_dir


def _is_png(path):
    return path.read_bytes()[:8] == PNG_SIGNATURE


def test_plot_run_writes_panels_with_data_and_skips_empty_ones(tmp_path):
    run = _fake_run(tmp_path / "run")
    written = plot_run(run)
    # no optim/grad_norm etc. is needed: optim.png has loss/policy and policy/entropy
    assert [p.name for p in written] == ["reward.png", "eval.png", "behaviour.png", "optim.png", "time.png"]
    assert all(p.parent == run / "plots" and _is_png(p) for p in written)
    assert plt.get_fignums() == []  # every figure was closed


def test_plot_run_draws_per_kind_panels_when_kinds_are_logged(tmp_path):
    with MetricsLog(tmp_path / "run", tensorboard=False) as log:
        for step in (1, 2, 3):
            log.log(step, {"reward/mean": 0.5, "kind/multi_hop/searches": 1.0 + step / 3, "kind/multi_hop/reward": 0.2})
    written = plot_run(tmp_path / "run")
    assert [p.name for p in written] == ["reward.png", "kinds.png"]
    assert _is_png(written[1])


def test_plot_stages_draws_one_bar_per_stage_and_kind(tmp_path):
    row = {"reward": 0.5, "reward_se": 0.1, "searches_per_episode": 1.0}
    results = {"stages": {name: {"by_kind": {"single_hop": row, "in_prompt": row}} for name in ("sft", "rl")}}
    path = plot_stages(results, tmp_path / "stages.png")
    assert _is_png(path) and plt.get_fignums() == []
    with pytest.raises(ValueError, match="no per-kind stage results"):
        plot_stages({"stages": {}}, tmp_path / "none.png")


def test_plot_run_without_eval_or_behaviour_data_skips_those_panels(tmp_path):
    with MetricsLog(tmp_path / "run", tensorboard=False) as log:
        for step in range(1, 4):
            log.log(step, {"reward/mean": 0.1 * step, "optim/lr": 1e-5})
    written = plot_run(tmp_path / "run", out_dir=tmp_path / "figures")
    assert [p.name for p in written] == ["reward.png", "optim.png"]
    assert not (tmp_path / "figures" / "eval.png").exists()
    assert not (tmp_path / "figures" / "behaviour.png").exists()


def test_plot_run_all_null_key_counts_as_absent(tmp_path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"reward/mean": 0.5, "episode/turns": float("nan")})
    assert [p.name for p in plot_run(tmp_path)] == ["reward.png"]


def test_eval_lines_do_not_cut_gaps_into_training_series(tmp_path):
    # the eval lines share a step with a training line and also carry time/eval_s
    records = _merge_by_step(read_metrics(_fake_run(tmp_path)))
    steps, values = _series(_train_records(records), "loss/policy")
    assert steps.tolist() == list(range(1, 13)) and np.isfinite(values).all()
    steps, values = _series(_eval_records(records), "eval/em")
    assert steps.tolist() == [4, 8, 12] and values.tolist() == [0.2, 0.4, 0.6]
    _, entropy = _series(_train_records(records), "policy/entropy")
    assert np.isnan(entropy[3]) and entropy[2] == 0.7  # null stays a gap, not a zero
    _, eval_seconds = _series(_train_records(records), "time/eval_s")
    assert eval_seconds[[3, 7, 11]].tolist() == [5.0, 5.0, 5.0] and np.isnan(eval_seconds[0])


def test_compare_runs_writes_one_png(tmp_path):
    runs = {name: _fake_run(tmp_path / name, reward_scale=scale)
            for name, scale in (("grpo", 1.0), ("rloo", 0.8), ("ppo", 0.6))}
    out = compare_runs(runs, "reward/mean", tmp_path / "cmp" / "reward.png", smooth=0.6)
    assert out == tmp_path / "cmp" / "reward.png" and _is_png(out)
    assert compare_runs(runs, "eval/em", tmp_path / "eval_em.png").exists()
    with pytest.raises(ValueError, match="logged 'policy/kl'"):
        compare_runs(runs, "policy/kl", tmp_path / "kl.png")
    assert plt.get_fignums() == []


def test_ema_matches_hand_computed_values_and_keeps_gaps():
    smoothed = _ema(np.array([1.0, np.nan, 3.0]), 0.5)
    # debiased: step 1 -> 1; step 3 -> (0.5*0.5*1 + 0.5*3) / (0.5*0.5 + 0.5) = 1.75/0.75
    assert smoothed[0] == 1.0 and np.isnan(smoothed[1]) and smoothed[2] == pytest.approx(1.75 / 0.75)


def test_missing_metrics_file_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        plot_run(tmp_path)
    assert str(error.value) == f"{tmp_path}: no metrics.jsonl (is this a ponder run directory?)"
