"""`ponder train` → `--resume` → `plot` through the CLI on the tiny model."""

from __future__ import annotations

import json

from ponder.cli import main

TINY = [
    "model.name=tiny", "sft.steps=2", "sft.batch_size=2", "sft.examples=4", "train.steps=2",
    "train.tasks_per_step=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens_per_turn=8",
    "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2", "train.save_every=1", "lora.r=4",
]  # fmt: skip


def _steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_train_resume_and_plot(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(run), *TINY]) == 0
    assert _steps(run) == [1, 2]
    assert len((run / "sft" / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert main(["train", "--resume", str(run), "train.steps=3"]) == 0
    assert _steps(run) == [1, 2, 3]
    assert main(["plot", str(run)]) == 0
    written = capsys.readouterr().out.split()
    assert str(run / "plots" / "reward.png") in written
    assert (run / "plots" / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "cmp.png"
    assert main(["plot", "--compare", str(run), str(run / "sft"), "--key", "reward/mean", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(run), str(run)]) == 2  # two runs without --compare
    assert main(["plot", "--compare", str(run), "--out", str(out)]) == 2  # no --key
    assert "--compare needs at least one --key" in capsys.readouterr().err


def test_unknown_estimator_fails_before_loading(tmp_path, capsys):
    code = main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(tmp_path / "r"),
                 "algo.advantage=gpro", "sft.steps=0", "model.name=./no/such/model"])  # fmt: skip
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert "unknown advantage estimator 'gpro'" in message and "grpo" in message
    assert not (tmp_path / "r").exists()


def test_sft_from_trains_from_another_runs_warm_up_without_warming_up_again(tmp_path, capsys):
    from ponder.models.adapters import saved_weights

    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(first), *TINY]) == 0
    assert main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(second), *TINY,
                 "--sft-from", str(first), "algo.advantage=rloo", "optim.lr=1e-6"]) == 0  # fmt: skip
    # the warm-up was copied, not run again: the same weights and the same SFT log
    assert (second / "sft" / "metrics.jsonl").read_bytes() == (first / "sft" / "metrics.jsonl").read_bytes()
    warm = saved_weights(first / "sft")
    assert saved_weights(second / "sft").keys() == warm.keys()
    # RL started from them: after two steps at lr 1e-6 the LoRA B factors (zero at a
    # fresh start) are still the warm-up's, to within the steps' change
    trained = saved_weights(second / "checkpoints" / "step-000002")
    b_keys = [key for key in warm if "lora_B" in key]
    assert b_keys and max(warm[k].abs().max().item() for k in b_keys) > 1e-4
    assert max((trained[k] - warm[k]).abs().max().item() for k in b_keys) < 1e-5
    assert _steps(second) == [1, 2]
    # a warm-up made with other settings is refused before anything is written
    code = main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(tmp_path / "third"), *TINY,
                 "--sft-from", str(first), "sft.lr=1e-3"])  # fmt: skip
    assert code == 2
    assert "section 'sft' differs from this recipe; reuse needs the same warm-up" in capsys.readouterr().err
    assert not (tmp_path / "third").exists()


def test_resume_of_a_run_killed_during_its_warm_up_warms_up_again(tmp_path, capsys, monkeypatch):
    import ponder.jobs.train as train_job

    real_warm_up, calls = train_job.warm_up, []

    def killed_after_one_step(recipe, policy, log_dir, on_step=None):
        calls.append(log_dir)

        def step(number, metrics):
            if on_step is not None:
                on_step(number, metrics)
            if len(calls) == 1:
                raise KeyboardInterrupt  # the kill, after the warm-up's first step was logged

        return real_warm_up(recipe, policy, log_dir, step)

    monkeypatch.setattr(train_job, "warm_up", killed_after_one_step)
    run = tmp_path / "run"
    assert main(["train", "--recipe", "recipes/search_qa_grpo.yaml", "--out", str(run), *TINY]) == 130
    assert len((run / "sft" / "metrics.jsonl").read_text().splitlines()) == 1
    assert not (run / "checkpoints").exists()
    assert main(["train", "--resume", str(run)]) == 0
    assert "stopped during its SFT warm-up; warming up again" in capsys.readouterr().out
    assert len(calls) == 2
    assert len((run / "sft" / "metrics.jsonl").read_text().splitlines()) == 2  # the partial log went
    assert _steps(run) == [1, 2]


def test_resume_of_a_directory_without_a_run_says_what_to_type(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "--resume", str(empty)]) == 2
    assert f"ponder train --recipe RECIPE --out {empty}" in capsys.readouterr().err
