"""The reward-hacking rates reach an RL run's metrics.jsonl, and the recipe's shaping
penalties enter its reward breakdown (tiny random model, math environment)."""

from __future__ import annotations

import math

from ponder.jobs.parts import rl_trainer
from ponder.config import load_recipe
from ponder.runlog.metrics_log import read_metrics

MATH_TINY = [
    "model.name=tiny", "env.kind=math", "env.options.n_train=8", "env.options.n_eval=2", "train.steps=2",
    "train.tasks_per_step=2", "rollout.group_size=2", "rollout.batch_size=4",
    "rollout.sampling.max_new_tokens_per_turn=8", "env.max_turns=2", "lora.r=4", "algo.micro_batch_size=2",
    "train.save_every=10", "reward.shaping.guess=0.5", "reward.shaping.repetition=0.2", "reward.shaping.window=2",
]  # fmt: skip


def test_hacking_rates_and_shaping_reach_the_run_metrics(tmp_path):
    rl_trainer(load_recipe(None, MATH_TINY), tmp_path).train()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        for key in ("hacking/format_gaming", "hacking/repetition", "hacking/truncation_rate"):
            assert 0.0 <= record[key] <= 1.0, key
        assert record["hacking/length_gaming"] in (0.0, 1.0)
        # the random model never answers right, so no episode can be a guess
        assert record["hacking/answer_guessing"] == 0.0
        assert record["reward/shaping/guess"] == 0.0
        assert 0.0 <= record["reward/shaping/repetition"] <= 1.0
    assert math.isnan(records[0]["hacking/truncation_slope"]) and math.isfinite(records[1]["hacking/truncation_slope"])
