import numpy as np
import pytest
from matplotlib import pyplot as plt

from ponder.runlog.metrics_log import MetricsLog
from ponder.runlog.metrics_log import read_metrics
from ponder.runlog.plot import (
    DPO_PANELS, SFT_PANELS, plot_stages,
    _ema, _eval_records, _merge_by_step, _other_keys, _panel_figure, _reward_figure, _series, _train_records,
    compare_runs, compare_series, plot_run,
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


def test_compare_overlays_several_keys_and_reads_a_demo_from_its_rl_dir(tmp_path):
    demo = tmp_path / "demo"
    _fake_run(demo / "rl", steps=8, reward_scale=2.0)  # a `ponder demo` keeps RL metrics in rl/
    plain = _fake_run(tmp_path / "plain", steps=4, with_eval=False)
    panels = compare_series({"demo": demo, "plain": plain}, ["reward/mean", "eval/em"])
    steps, values = panels["reward/mean"]["demo"]
    assert steps.tolist() == list(range(1, 9)) and values[-1] == pytest.approx(2.0)
    assert panels["reward/mean"]["plain"][1].tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert panels["eval/em"]["demo"][0].tolist() == [4, 8]  # evaluations at their own steps only
    assert not np.isfinite(panels["eval/em"]["plain"][1]).any()  # no data: an empty line, not zeros
    out = compare_runs({"demo": demo, "plain": plain}, ["reward/mean", "eval/em", "episode/searches"],
                       tmp_path / "three.png", smooth=0.5)  # fmt: skip
    assert _is_png(out) and plt.get_fignums() == []
    with pytest.raises(ValueError, match="logged 'policy/kl'"):
        compare_series({"demo": demo}, ["reward/mean", "policy/kl"])


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


def test_directory_without_metrics_says_there_is_nothing_to_plot(tmp_path):
    # a demo stopped before training: results and evaluations, no metrics.jsonl anywhere
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-000001").mkdir(parents=True)
    with pytest.raises(ValueError) as error:
        plot_run(tmp_path)
    assert str(error.value) == (
        f"{tmp_path}: nothing to plot (no metrics.jsonl in it or its subdirectories; "
        "give a run, stage, demo or pipeline directory)"
    )
    assert not (tmp_path / "plots").exists()
    with pytest.raises(FileNotFoundError, match="no such directory"):
        plot_run(tmp_path / "missing")


def test_metrics_without_a_single_number_is_nothing_to_plot(tmp_path):
    with MetricsLog(tmp_path / "run", tensorboard=False) as log:
        log.log(1, {"phase": "warmup", "sft/loss": float("nan")})
    with pytest.raises(ValueError, match="nothing to plot \\(no finite number in .*metrics.jsonl\\)"):
        plot_run(tmp_path / "run")


def _sft_stage(stage_dir, steps=4, eval_every=2):
    """What SFTTrainer logs: sft/* every step, sft/eval_loss on evaluation steps."""
    with MetricsLog(stage_dir, tensorboard=False) as log:
        for step in range(1, steps + 1):
            metrics = {"sft/loss": 2.0 / step, "sft/ewc_penalty": 0.0, "sft/grad_norm": 1.5, "sft/lr": 1e-4,
                       "sft/replayed": 0.0, "sft/tokens": 64.0}  # fmt: skip
            if step % eval_every == 0:
                metrics["sft/eval_loss"] = 3.0 / step
            log.log(step, metrics)
    return stage_dir


def _dpo_stage(stage_dir, steps=3):
    with MetricsLog(stage_dir, tensorboard=False) as log:
        for step in range(1, steps + 1):
            log.log(step, {"dpo/loss": 0.69 - step / 100, "dpo/chosen_reward": 0.1 * step,
                           "dpo/rejected_reward": -0.1 * step, "dpo/accuracy": 0.5, "dpo/margin": 0.2 * step,
                           "dpo/grad_norm": 1.0, "dpo/lr": 5e-6})  # fmt: skip
    return stage_dir


def _warm_up(log_dir, steps=3):
    """What the RL trainer's and the demo's SFT warm-up (train.sft.warm_up) logs."""
    with MetricsLog(log_dir, tensorboard=False) as log:
        for step in range(1, steps + 1):
            log.log(step, {"sft/loss": 1.0 / step, "sft/grad_norm": 0.5, "sft/lr": 1e-4})
    return log_dir


def _relative(paths, root):
    return [p.relative_to(root).as_posix() for p in paths]


def test_sft_stage_directory_gets_its_loss_curves(tmp_path):
    stage = _sft_stage(tmp_path / "01-sft")
    written = plot_run(stage)
    assert _relative(written, stage) == ["plots/sft.png"]
    assert _is_png(written[0]) and plt.get_fignums() == []


def test_sft_figure_draws_train_and_held_out_loss_on_one_panel(tmp_path):
    records = _merge_by_step(read_metrics(_sft_stage(tmp_path, steps=4, eval_every=2)))
    figure = _panel_figure(_train_records(records), SFT_PANELS, "sft")
    try:
        loss = figure.axes[0]
        assert loss.get_title() == "loss" and [line.get_label() for line in loss.lines] == ["train", "held-out"]
        assert loss.lines[0].get_ydata().tolist() == [2.0, 1.0, 2.0 / 3, 0.5]
        held_out = loss.lines[1].get_ydata()
        assert np.isnan(held_out[[0, 2]]).all() and held_out[[1, 3]].tolist() == [1.5, 0.75]
        titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
        assert titles == ["loss", "gradient norm", "learning rate", "tokens", "replay", "EWC penalty"]
    finally:
        plt.close(figure)


def test_demo_directory_plots_rl_and_sft_into_their_own_plots_folders(tmp_path):
    demo = tmp_path / "demo"
    _fake_run(demo / "rl")
    _warm_up(demo / "sft")
    demo.joinpath("results.json").write_text("{}")
    written = plot_run(demo)
    assert _relative(written, demo) == [
        "rl/plots/reward.png", "rl/plots/eval.png", "rl/plots/behaviour.png", "rl/plots/optim.png",
        "rl/plots/time.png", "sft/plots/sft.png",
    ]  # fmt: skip
    assert all(_is_png(path) for path in written)


def test_rl_run_with_its_warm_up_plots_both(tmp_path):
    run = _fake_run(tmp_path / "run", with_eval=False)
    _warm_up(run / "sft")
    written = plot_run(run, out_dir=tmp_path / "figures")
    assert _relative(written, tmp_path / "figures") == [
        "reward.png", "behaviour.png", "optim.png", "time.png", "sft/sft.png",
    ]  # fmt: skip


def test_pipeline_directory_plots_every_training_stage_in_order(tmp_path):
    out = tmp_path / "pipeline"
    (out / "00-eval-base" / "eval").mkdir(parents=True)
    (out / "00-eval-base" / "eval" / "results.json").write_text("{}")
    _sft_stage(out / "01-warmup")
    _sft_stage(out / "02-sft")
    _dpo_stage(out / "03-dpo")
    (out / "03-dpo" / "checkpoints" / "step-000003").mkdir(parents=True)
    written = plot_run(out)
    assert _relative(written, out) == ["01-warmup/plots/sft.png", "02-sft/plots/sft.png", "03-dpo/plots/dpo.png"]
    assert all(_is_png(path) for path in written)


def test_dpo_figure_draws_chosen_rejected_and_margin_together(tmp_path):
    records = _merge_by_step(read_metrics(_dpo_stage(tmp_path)))
    figure = _panel_figure(_train_records(records), DPO_PANELS, "dpo")
    try:
        titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
        assert titles == ["loss", "implicit reward", "accuracy", "gradient norm", "learning rate"]
        assert [line.get_label() for line in figure.axes[1].lines] == ["chosen", "rejected", "margin"]
        assert figure.axes[1].lines[2].get_ydata().tolist() == pytest.approx([0.2, 0.4, 0.6])
    finally:
        plt.close(figure)


def test_metrics_no_figure_knows_go_to_other_png(tmp_path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        for step in (1, 2):
            log.log(step, {"reward/mean": 0.5, "policy/kl_coef": 0.01, "episode/answered": 1.0, "phase": "x"})
    records = _train_records(_merge_by_step(read_metrics(tmp_path)))
    assert _other_keys(records) == ["episode/answered", "phase", "policy/kl_coef"]
    assert [p.name for p in plot_run(tmp_path)] == ["reward.png", "other.png"]


def _reward_records(tmp_path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        for step in (1, 2, 3):
            log.log(step, {"reward/mean": 0.2 * step, "reward/std": 0.1, "reward/em": 0.25 * step,
                           "reward/search_cost": 3.0 + step, "reward/penalty/wrong_tool": 1.0})  # fmt: skip
    return _train_records(_merge_by_step(read_metrics(tmp_path)))


def test_reward_figure_puts_search_counts_on_their_own_axes(tmp_path):
    figure = _reward_figure(_reward_records(tmp_path), "run")
    try:
        reward, counts = figure.axes
        assert [line.get_label() for line in reward.lines] == ["mean", "em"]
        assert reward.get_ylim()[1] < 1.0  # not stretched to fit the search counts (4 to 6)
        assert [line.get_label() for line in counts.lines] == ["penalty/wrong_tool", "searches (search_cost)"]
        assert counts.lines[1].get_ydata().tolist() == [4.0, 5.0, 6.0]
    finally:
        plt.close(figure)


def test_step_axes_show_whole_steps(tmp_path):
    figure = _reward_figure(_reward_records(tmp_path), "run")
    try:
        for ax in figure.axes:
            ticks = [tick for tick in ax.get_xticks() if ax.get_xlim()[0] <= tick <= ax.get_xlim()[1]]
            assert ticks and all(float(tick).is_integer() for tick in ticks)
    finally:
        plt.close(figure)
