"""`--model RUN` names the weights it resolved to: the header line of `ponder eval` and
its metrics.json record the directory loaded (a run's best/, its latest checkpoint, a
stage) and that directory's step."""

import json

from ponder.cli import main
from ponder.config import LoraConfig
from ponder.eval.runner import describe_weights, trained_weights
from ponder.models.adapters import save_trained
from ponder.models.lora import apply_lora
from ponder.models.tiny import tiny_policy


def _adapter(directory):
    return save_trained(apply_lora(tiny_policy(seed=1), LoraConfig(r=4, alpha=8)), directory)


def _metrics(directory, records):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_best_weights_name_the_validation_s_best_step(tmp_path):
    run = tmp_path / "demo" / "rl"
    _adapter(run / "best")
    _adapter(run / "checkpoints" / "step-000006")
    (run / "checkpoints" / "latest").write_text("step-000006\n")
    _metrics(run, [{"step": 1, "val/best_step": 0}, {"step": 4, "val/best_step": 3}, {"step": 6}])
    assert trained_weights(str(run)) == {"weights": str(run / "best"), "weights_step": 3}
    assert describe_weights(trained_weights(str(run))) == f" (weights {run / 'best'}, step 3)"


def test_a_checkpoint_and_a_stage_name_their_steps(tmp_path):
    run = tmp_path / "run"
    _adapter(run / "checkpoints" / "step-000012")
    (run / "checkpoints" / "latest").write_text("step-000012\n")
    assert trained_weights(str(run)) == {"weights": str(run / "checkpoints" / "step-000012"), "weights_step": 12}
    sft = tmp_path / "other" / "sft"
    _adapter(sft)
    _metrics(sft, [{"step": 1}, {"step": 2}])
    assert trained_weights(str(tmp_path / "other")) == {"weights": str(sft), "weights_step": 2}
    bare = _adapter(tmp_path / "exported")  # a directory that says nothing of its step
    assert trained_weights(str(bare)) == {"weights": str(bare), "weights_step": None}
    assert describe_weights(trained_weights(str(bare))) == f" (weights {bare})"


def test_names_and_hugging_face_models_are_not_runs(tmp_path):
    assert trained_weights("tiny") == {} and trained_weights("smollm2-135m") == {}
    assert describe_weights({}) == ""


def test_eval_of_a_run_records_the_weights_and_step_it_loaded(tmp_path, capsys):
    run = tmp_path / "rl"
    _adapter(run / "best")
    _metrics(run, [{"step": 2, "val/best_step": 2}, {"step": 4, "val/best_step": 2}])
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(run), "--episodes", "2", "--out", str(out),
            "rollout.sampling.max_new_tokens_per_turn=8"]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["model"], metrics["weights"], metrics["weights_step"]) == (str(run), str(run / "best"), 2)
    header = capsys.readouterr().err.splitlines()[0]
    assert f"model={run} (weights {run / 'best'}, step 2)" in header
