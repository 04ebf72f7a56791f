"""bench/continual_forgetting.py end to end on the tiny model: every continual-learning
method in one table, from one command (two search-QA families, one step each)."""

import json
from pathlib import Path

from bench import continual_forgetting as bench

ROOT = Path(__file__).resolve().parents[2]
TINY_WORLD = ["env.options.taskgen.n_people=20", "env.options.taskgen.n_train=12", "env.max_turns=2",
              "env.options.max_obs_tokens=32", "rollout.sampling.max_total_tokens=1024"]  # fmt: skip


def test_every_method_in_one_table(tmp_path):
    argv = ["--model", "tiny", "--recipe", str(ROOT / "recipes" / "pipeline_search_qa.yaml"),
            "--families", "single_hop,in_prompt", "--world-eval-tasks", "6", "--train-per-family", "2",
            "--eval-per-family", "1", "--steps", "1", "--batch-size", "2", "--lora-r", "4",
            "--replay-capacity", "2", "--memory-batch-size", "1", "--derpp-topk", "4", "--lora-merge", "linear",
            "--methods", "all", "--out", str(tmp_path)]  # fmt: skip
    for override in TINY_WORLD:
        argv += ["--set", override]
    assert bench.main(argv) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [row["method"] for row in rows] == list(bench.ALL)
    assert all({"AA", "BWT", "FWT"} <= set(row) and len(row["accuracy"]) == 2 for row in rows)
    by_method = {row["method"]: row for row in rows}
    assert by_method["lora_per_task"]["merged_AA"] is not None and by_method["naive"]["merged_AA"] is None
    assert by_method["ewc"]["continual"]["replay_capacity"] == 0  # the regularisers run without rehearsal
    table = (tmp_path / "table.md").read_text()
    assert table.count("\n") == 2 + len(bench.ALL) and "| derpp |" in table
