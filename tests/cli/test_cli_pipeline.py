"""`ponder pipeline run`: bad input is one line naming the problem, exit code 2."""

from __future__ import annotations

import json

from ponder.cli import main

TINY = ["model.name=tiny", "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2"]


def _error(args: list[str], capsys) -> str:
    code = main(["pipeline", "run", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("ponder pipeline: error: ")
    return err[-1]


def test_unknown_stage_fails_before_anything_loads(tmp_path, capsys):
    recipe = "recipes/pipeline_search_qa.yaml"
    line = _error(["--out", str(tmp_path / "run"), recipe, *TINY, "pipeline.stages=[sft, ppo]"], capsys)
    assert line.endswith("pipeline.stages: unknown ['ppo']; valid: warmup, sft, dpo, rl, eval")
    assert not (tmp_path / "run").exists()


def test_a_dataset_with_nothing_usable_names_the_reasons(tmp_path, capsys):
    rows = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": "{}"}}]}]},
    ]  # fmt: skip
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = ["recipes/pipeline_search_qa.yaml", *TINY, f"data.sft_path={data}", "pipeline.stages=[sft]"]
    line = _error([*recipe, "pipeline.eval_before=false", "--out", str(tmp_path / "run")], capsys)
    assert line.endswith(
        f"{data}: no usable sft example among 2 rows (1 no assistant turn, 1 undeclared tool)"
    )
