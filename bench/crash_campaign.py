"""Crash and corruption campaigns on the tiny model (issue 21; docs/results/safety.md).

Kill campaign: `ponder train` and `ponder pipeline run` are SIGKILLed at random
moments, resumed (again and again, if a resume is killed too) to the end, and the
finished run is compared bit for bit — every saved adapter tensor and every logged
metric, wall-clock fields aside — with an uninterrupted run of the same recipe.

Corruption campaign: each file of a finished run's newest checkpoint is truncated,
bit-flipped, deleted or emptied, and the `latest` pointer is made dangling, pointed
outside the run, emptied or deleted; `ponder train --resume` must name the damage in
one warning line and resume from the newest intact checkpoint.

    .venv/bin/python bench/crash_campaign.py --kills 20 --out runs/crash

Run from the repository root (the varying reward below is named by import path).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PONDER = [sys.executable, "-m", "ponder.cli"]
# A reward that varies between samples of the tiny model, so RL steps really change
# the weights (a constant reward gives zero advantages and proves nothing).
TRAIN = [
    "--recipe", "recipes/search_qa_grpo.yaml", "model.name=tiny", "sft.steps=3", "sft.batch_size=2",
    "sft.examples=4", "train.steps=6", "train.tasks_per_step=2", "rollout.group_size=4",
    "rollout.sampling.max_new_tokens_per_turn=8", "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8",
    "env.options.taskgen.n_eval=2", "train.save_every=1", "lora.r=4", "reward.terms={'bench.crash_campaign:low_ids': 1.0}",
]  # fmt: skip
PIPELINE = [
    "recipes/pipeline_search_qa.yaml", "model.name=tiny", "env.options.taskgen.n_people=20", "env.options.taskgen.n_train=12",
    "env.options.taskgen.n_eval=4", "env.max_turns=2", "env.options.max_obs_tokens=32", "rollout.batch_size=8",
    "rollout.sampling.max_new_tokens_per_turn=8", "eval.episodes=2", "sft.steps=2", "sft.batch_size=2",
    "sft.examples=4", "sft_trainer.steps=4", "sft_trainer.batch_size=2", "sft_trainer.micro_batch_size=1",
    "sft_trainer.save_every=1", "data.max_examples=4", "train.steps=3", "train.tasks_per_step=2",
    "train.save_every=1", "rollout.group_size=4", "algo.micro_batch_size=2", "lora.r=4", "lora.alpha=8",
    "pipeline.stages=[warmup, sft, rl, eval]", "reward.terms={'bench.crash_campaign:low_ids': 1.0}",
]  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def low_ids(trajectory: Any, task: Any) -> float:
    """Share of generated tokens with an even id: varies between samples."""
    ids = [i for i, m in zip(trajectory.response_ids, trajectory.loss_mask) if m]
    return sum(i % 2 == 0 for i in ids) / len(ids) if ids else 0.0


def train_command(out: Path, resume: bool) -> list[str]:
    return PONDER + (["train", "--resume", str(out)] if resume else ["train", *TRAIN, "--out", str(out)])


def pipeline_command(out: Path, resume: bool) -> list[str]:
    return PONDER + ["pipeline", "run", *PIPELINE, "--out", str(out)] + (["--resume"] if resume else [])


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=900)


def fingerprint(run_dir: Path) -> dict[str, str]:
    """sha256 of every adapter tensor file's tensors and of every metrics file, untimed."""
    from safetensors.torch import load_file

    prints = {}
    for path in sorted(run_dir.rglob("adapter_model.safetensors")):
        tensors = load_file(path)
        digest = hashlib.sha256(b"".join(k.encode() + tensors[k].numpy().tobytes() for k in sorted(tensors)))
        prints[str(path.relative_to(run_dir))] = digest.hexdigest()
    for path in sorted(run_dir.rglob("metrics.jsonl")):
        rows = [_untimed(json.loads(line)) for line in path.read_text().splitlines()]
        prints[str(path.relative_to(run_dir))] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return prints


def _untimed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "time" and not k.startswith("time/") and not k.endswith("_s")}


def kill_campaign(kind: str, kills: int, seed: int, out: Path) -> dict[str, Any]:
    """`kills` runs each SIGKILLed once at a random moment of its run, then resumed to
    the end. A run that finishes before its moment does not count: the next moment is
    drawn within that run's own duration (the machine's load changes how long a run takes)."""
    command = train_command if kind == "train" else pipeline_command
    reference = out / f"{kind}-reference"
    shutil.rmtree(reference, ignore_errors=True)
    tick = time.perf_counter()
    done = run(command(reference, resume=False))
    span = time.perf_counter() - tick
    if done.returncode != 0:
        raise SystemExit(f"{kind} reference run failed: {done.stderr.strip().splitlines()[-1:]}")
    expected = fingerprint(reference)
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []
    started_runs = 0
    while len(cases) < kills and started_runs < kills * 4:
        started_runs += 1
        run_dir = out / f"{kind}-kill-{len(cases):02d}"
        shutil.rmtree(run_dir, ignore_errors=True)
        at = rng.uniform(0.5, span)
        started = time.perf_counter()
        process = subprocess.Popen(command(run_dir, resume=False), env=ENV, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            process.wait(timeout=at)
            span = time.perf_counter() - started  # finished first: draw within its own duration
            continue
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        cases.append({"kill_at_s": round(at, 2), **_resume_to_end(command, run_dir, expected)})
        print(f"{kind} kill {len(cases)}/{kills} at {at:.1f} s: {cases[-1]['outcome']}", flush=True)
    identical = sum(c["outcome"] == "identical" for c in cases)
    return {"kind": kind, "reference_wall_s": round(span, 1), "kills": len(cases), "identical": identical,
            "runs_started": started_runs, "cases": cases}  # fmt: skip


def _resume_to_end(command: Any, run_dir: Path, expected: dict[str, str]) -> dict[str, Any]:
    """Resume until the run finishes; a resume that refuses (nothing to resume yet) starts it afresh."""
    restarted = False
    done = run(command(run_dir, resume=True))
    if done.returncode == 2 and "nothing to resume" in done.stderr:
        restarted = True
        done = run(command(run_dir, resume=False) + ["--overwrite"])
    if done.returncode != 0:
        return {"outcome": "failed", "restarted": restarted, "error": done.stderr.strip().splitlines()[-1:]}
    same = fingerprint(run_dir) == expected
    return {"outcome": "identical" if same else "different", "restarted": restarted}


DAMAGES = ("truncate", "bit flip", "delete", "empty")
POINTER_DAMAGES = {"dangling": "step-000099\n", "outside the run": "../../../etc\n", "empty": "", "deleted": None}


def corruption_campaign(out: Path) -> dict[str, Any]:
    """Damage each file of the newest checkpoint and the pointer; resume must fall back."""
    source = out / "train-reference"
    root = source / "checkpoints"
    newest = (root / "latest").read_text().strip()
    files = sorted(p.name for p in (root / newest).iterdir())
    cases = [(name, damage) for name in files for damage in DAMAGES]
    cases += [("latest", damage) for damage in POINTER_DAMAGES]
    results = []
    for name, damage in cases:
        run_dir = out / "corrupt"
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(source, run_dir)
        _damage(run_dir / "checkpoints", newest, name, damage)
        done = run(PONDER + ["train", "--resume", str(run_dir), "train.steps=7"])
        warnings = [line for line in done.stderr.splitlines() if line.startswith("ponder: warning:")]
        started = [line for line in done.stdout.splitlines() if " from step " in line]
        results.append({"file": name, "damage": damage, "exit": done.returncode, "warning": warnings[:1],
                        "error": done.stderr.strip().splitlines()[-1:] if done.returncode else [],
                        "resumed": started[0].split(" from step ")[1].split()[0] if started else None})  # fmt: skip
        print(f"{name} {damage}: exit {done.returncode}, from step {results[-1]['resumed']}, {warnings[:1]}", flush=True)
    return {"newest": newest, "cases": results}


def _damage(root: Path, newest: str, name: str, damage: str) -> None:
    if name == "latest":
        text = POINTER_DAMAGES[damage]
        (root / "latest").unlink() if text is None else (root / "latest").write_text(text)
        return
    path = root / newest / name
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "bit flip":
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(flipped))
    elif damage == "delete":
        path.unlink()
    else:
        path.write_bytes(b"")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/crash"))
    parser.add_argument("--only", choices=("train", "pipeline", "corrupt"), action="append")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = args.only or ["train", "pipeline", "corrupt"]
    report: dict[str, Any] = {}
    for kind in ("train", "pipeline"):
        if kind in wanted:
            report[kind] = kill_campaign(kind, args.kills, args.seed, args.out)
    if "corrupt" in wanted:
        if not (args.out / "train-reference").is_dir():
            kill_campaign("train", 0, args.seed, args.out)
        report["corruption"] = corruption_campaign(args.out)
    (args.out / "campaign.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: {x: v[x] for x in ("kills", "identical") if x in v} for k, v in report.items()}))


if __name__ == "__main__":
    main()
