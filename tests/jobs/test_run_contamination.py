"""`ponder demo` and `ponder pipeline` check their own training data against the
held-out tasks they score: the report in the run directory, one line said, the
totals in the run's results."""

from __future__ import annotations

import json

from ponder.config import PipelineRecipe, load_recipe
from ponder.data import Conversation, write_jsonl
from ponder.jobs.demo import run_demo
from ponder.jobs.pipeline import Context, check_contamination_of, run_pipeline
from ponder.models import load_policy
from ponder.wiring import build_env
from tests.jobs.test_demo import TINY as DEMO_TINY
from tests.jobs.test_pipeline import TINY as PIPELINE_TINY


def test_the_demo_checks_its_splits_before_it_evaluates(tmp_path):
    said = []
    out = tmp_path / "demo"
    recipe = load_recipe(None, [*DEMO_TINY, "sft.steps=0", "train.steps=0"])
    results = run_demo(recipe, out, say=said.append, skip_oracle=True)
    summary = results["contamination"]
    assert (summary["eval_items"], summary["train_items"], summary["flagged"]) == (4, 16, 0)
    assert summary["by_signal"] == {"ngram13": 0, "ngram8": 0, "numbers8": 0}
    assert json.loads((out / "results.json").read_text())["contamination"]["flagged"] == 0
    report = json.loads((out / "contamination.json").read_text())
    assert len(report["items"]) == 4 and report["summary"]["skipped"] == ""
    line = next(line for line in said if line.startswith("contamination:"))
    assert line == ("contamination: 0 of 4 eval items (0.0%) match the 16 train items (ngram13 0, ngram8 0, "
                    "numbers8 0; embedding off)")
    assert said.index(line) < next(i for i, s in enumerate(said) if s.startswith("eval base"))


def test_the_pipeline_counts_its_sft_file_and_records_the_share(tmp_path):
    recipe = load_recipe(None, [*PIPELINE_TINY, "pipeline.stages=[eval]"], cls=PipelineRecipe)
    said = []
    stages = run_pipeline(recipe, tmp_path / "run", say=said.append)
    (_, metrics), = stages
    assert metrics["contamination_flagged"] == 0 and metrics["contamination_share"] == 0.0
    assert json.loads((tmp_path / "run" / "contamination.json").read_text())["summary"]["eval_items"] == 2
    assert sum(line.startswith("contamination: 0 of 2 eval items") for line in said) == 1

    # an SFT file that holds a held-out question: found, and named
    held_out = build_env(recipe).eval[0]
    sft = tmp_path / "sft.jsonl"
    messages = [{"role": "user", "content": held_out.question}, {"role": "assistant", "content": "<answer>x</answer>"}]
    write_jsonl(sft, [Conversation(messages, id="leak")])
    planted = load_recipe(None, [*PIPELINE_TINY, "pipeline.stages=[sft, eval]", f"data.sft_path={sft}"],
                          cls=PipelineRecipe)  # fmt: skip
    (tmp_path / "planted").mkdir()
    ctx = Context(planted, tmp_path / "planted", say=said.append)
    summary = check_contamination_of(ctx, load_policy("tiny"))
    assert summary["flagged"] == 1 and summary["train_items"] == 12 + 1
    report = json.loads((tmp_path / "planted" / "contamination.json").read_text())
    assert report["items"][0]["matches"]["ngram13"]["train_id"] == "leak"
