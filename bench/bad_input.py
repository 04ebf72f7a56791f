"""The bad-input table (issue 21; docs/results/safety.md): each case runs the real CLI
on the tiny model and must end with exit code 2, one line on stderr naming the
problem, and nothing written (no run directory, no half-made file).

    .venv/bin/python bench/bad_input.py --out runs/bad-input

Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PONDER = [sys.executable, "-m", "ponder.cli"]
TINY = ["model.name=tiny", "sft.steps=1", "sft.examples=2", "train.steps=1", "env.options.taskgen.n_people=20",
        "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2"]  # fmt: skip
TRAIN = ["train", "--recipe", "recipes/search_qa_grpo.yaml"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PONDER_DEBUG": ""}


def cases(data: Path) -> list[tuple[str, list[str]]]:
    """(what is wrong, ponder arguments without --out); `data` holds the bad files."""
    overrides = [
        "train.save_every=0", "rollout.group_size=0", "train.tasks_per_step=0", "rollout.batch_size=0",
        "rollout.sampling.temperature=-1", "rollout.sampling.top_p=0", "rollout.sampling.max_total_tokens=0",
        "env.max_turns=0", "train.steps=-3", "algo.gamma=1.5", "optim.lr=-1", "train.stop_grace_s=-1",
        "trian.steps=3", "algo.advantage=gpro", "algo.loss=nope", "rollout.sampling.temperature=hot",
        "env.kind=no_such_env", "env.kind=no_such_pkg.envs:Env", "env.kind=os:NoSuchEnv",
        "reward.terms={'no_such_pkg.r:f': 1.0}", "reward.terms={bogus: 1.0}", "model.device=cuda",
        f"model.name={data / 'garbage-model'}", f"env.train_tasks={data / 'bad-row.jsonl'}",
        f"env.train_tasks={data / 'bad-json.jsonl'}", f"env.train_tasks={data / 'missing.jsonl'}",
        f"env.options.corpus={data / 'bad-corpus.jsonl'}", f"env.eval_tasks={data / 'tasks.csv'}",
    ]  # fmt: skip
    rows = [(value, [*TRAIN, *TINY, value]) for value in overrides]
    rows += [
        ("recipe file missing", ["train", "--recipe", str(data / "nope.yaml"), *TINY]),
        ("recipe not YAML", ["train", "--recipe", str(data / "bad.yaml"), *TINY]),
        ("recipe a list", ["train", "--recipe", str(data / "list.yaml"), *TINY]),
        ("override without '='", [*TRAIN, *TINY, "train.steps"]),
        ("resume: nothing there", ["train", "--resume", str(data / "empty-run")]),
        ("eval: episodes 0", ["eval", "--recipe", "recipes/search_qa.yaml", "--episodes", "0", *TINY]),
        ("demo: task file bad row", ["demo", "--quick", *TINY, f"env.eval_tasks={data / 'bad-row.jsonl'}"]),
        ("pipeline: unknown stage", ["pipeline", "run", "recipes/pipeline_search_qa.yaml", *TINY,
                                     "pipeline.stages=[sft, ppo]"]),  # fmt: skip
        ("pipeline: SFT data bad line", ["pipeline", "run", "recipes/pipeline_search_qa.yaml", *TINY,
                                         f"data.sft_path={data / 'bad-json.jsonl'}", "pipeline.stages=[sft]"]),
        ("pipeline: SFT data bad tool schema", ["pipeline", "run", "recipes/pipeline_search_qa.yaml", *TINY,
                                                f"data.sft_path={data / 'bad-schema.jsonl'}",
                                                "pipeline.stages=[sft]"]),  # fmt: skip
    ]
    return rows


def write_bad_files(data: Path) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "bad-row.jsonl").write_text('{"id": "a", "question": "q?", "answers": ["x"]}\n{"id": "b"}\n')
    (data / "bad-json.jsonl").write_text('{"id": "a", "question": "q?", "answers": ["x"]}\n{"id": "b", \n')
    (data / "bad-corpus.jsonl").write_text('{"id": "d1", "contents": "text"}\n{"id": "d2"}\n')
    (data / "tasks.csv").write_text("id,question\na,q\n")
    (data / "bad.yaml").write_text("train: {steps: [1,\n")
    (data / "list.yaml").write_text("- 1\n- 2\n")
    (data / "empty-run").mkdir(exist_ok=True)
    (data / "garbage-model").mkdir(exist_ok=True)
    (data / "garbage-model" / "config.json").write_text("{not json")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], "tools": [tool]}
    (data / "bad-schema.jsonl").write_text(json.dumps(row) + "\n")


def run_case(name: str, args: list[str], out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = PONDER + args + ([] if "--resume" in args else ["--out", str(out)])
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line]
    errors = [line for line in lines if ": error: " in line]
    clean = done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr and not out.exists()
    return {"case": name, "exit": done.returncode, "message": errors[-1] if errors else (lines[-1:] or [""])[0],
            "wrote": out.exists(), "clean": clean}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/bad-input"))
    args = parser.parse_args()
    data = args.out / "data"
    write_bad_files(data)
    results = []
    for name, case_args in cases(data):
        results.append(run_case(name, case_args, args.out / "run"))
        row = results[-1]
        print(f"{'clean' if row['clean'] else 'NOT CLEAN'} | {name} | exit {row['exit']} | {row['message'][:110]}",
              flush=True)  # fmt: skip
    (args.out / "bad_input.json").write_text(json.dumps(results, indent=1))
    print(f"{sum(r['clean'] for r in results)} of {len(results)} cases clean")


if __name__ == "__main__":
    main()
