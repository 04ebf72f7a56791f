"""Model directories both systems load from disk (nothing comes from a hub):

- the embedded SmolLM2-135M-Instruct: ponder's cached safetensors copy;
- `tiny`: ponder's random test model saved once (for --smoke runs);
- the tool workload's start: the base model after ponder's SFT warm-up on replayed
  calculator demonstrations (Hermes tool calls, the benchmark's ChatML template),
  LoRA merged into the weights, cached by a hash of everything that made it.

    python -m bench.prepare --model smollm2-135m [--tool] [--sft-steps 40] [--sft-examples 64]

prints a protocol record {"event": "prepared", "base": DIR, "tool": DIR | null, "sft": {...}}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import emit
from bench.workloads import TOOL_TEMPLATE, EnvFactory, arithmetic_tasks, number_reward


@dataclass
class SFTSettings:
    """The tool workload's warm-up: steps × batch of replayed demonstrations (LoRA r16/α32)."""

    steps: int = 40
    examples: int = 64
    batch_size: int = 8
    lr: float = 3e-4
    seed: int = 0
    max_turns: int = 3


def base_model_dir(name: str) -> Path:
    """`smollm2-135m`, `tiny` or a local HF directory → a directory with config.json."""
    from ponder.models import cache_dir
    from ponder.models.loading import embedded_model_dir

    if name == "smollm2-135m":
        return embedded_model_dir()
    if name == "tiny":
        target = cache_dir() / "bench" / "tiny"
        if not (target / "config.json").is_file():
            from ponder.models import tiny_policy

            policy = tiny_policy()
            _save_atomically(target, policy.model, policy.tokenizer)
        return target
    path = Path(name)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model '{name}': give smollm2-135m, tiny or a local HF model directory (no config.json)"
        )
    return path


def tool_checkpoint(base: Path, settings: SFTSettings) -> tuple[Path, dict[str, Any]]:
    """The SFT-warmed tool checkpoint for `base` (built once, then reused from the cache)."""
    from ponder.models import cache_dir

    weights = base / "model.safetensors"
    stamp = f"{weights.stat().st_size}:{weights.stat().st_mtime_ns}" if weights.exists() else ""
    key = hashlib.sha256(json.dumps([str(base.resolve()), stamp, settings.__dict__, TOOL_TEMPLATE]).encode())
    target = cache_dir() / "bench" / f"tool-sft-{key.hexdigest()[:12]}"
    report_file = target / "bench_sft.json"
    if report_file.is_file():
        return target, json.loads(report_file.read_text())
    policy, report = _warm_up(base, settings)
    report["checkpoint"] = str(target)
    merged = policy.model.merge_and_unload()
    _save_atomically(target, merged, policy.tokenizer, {"bench_sft.json": json.dumps(report, indent=2)})
    return target, report


def _warm_up(base: Path, settings: SFTSettings) -> tuple[Any, dict[str, Any]]:
    from ponder.config import LoraConfig, RolloutConfig, SamplingConfig, SFTConfig
    from ponder.models import apply_lora, load_policy
    from ponder.rollout import RolloutEngine, ScriptedBackend
    from ponder.train.sft import sft_train

    policy = load_policy(str(base), "float32", "cpu")
    policy.tokenizer.chat_template = TOOL_TEMPLATE
    policy = apply_lora(policy, LoraConfig(r=16, alpha=32))
    factory = EnvFactory("tool", policy.tokenizer, settings.max_turns)
    tasks = arithmetic_tasks("tool", settings.examples, settings.seed + 7919)  # not the benchmark's tasks
    sampling = SamplingConfig(max_new_tokens_per_turn=1 << 16, max_total_tokens=1 << 20)
    rollout = RolloutConfig(batch_size=len(tasks), group_size=1, sampling=sampling)
    scripts = {t.id: list(t.oracle_actions) for t in tasks}
    replayed, _ = RolloutEngine(ScriptedBackend(policy.tokenizer, scripts), factory, rollout).run(tasks)
    demonstrations = [t for t in replayed if t.final_answer is not None]
    config = SFTConfig(steps=settings.steps, batch_size=settings.batch_size, lr=settings.lr, warmup_steps=2)
    history = sft_train(policy, demonstrations, config, settings.seed, micro_batch_size=settings.batch_size)
    report = {
        "demonstrations": len(demonstrations),
        "first_loss": history[0]["sft/loss"],
        "last_loss": history[-1]["sft/loss"],
        **_greedy_check(policy, factory, settings),
    }
    return policy, report


def _greedy_check(policy: Any, factory: EnvFactory, settings: SFTSettings, n: int = 8) -> dict[str, float]:
    """Greedy episodes on unseen tasks: does the warmed-up policy call the tool and answer?"""
    from ponder.config import RolloutConfig, SamplingConfig
    from ponder.rollout import HFBackend, RolloutEngine

    sampling = SamplingConfig(temperature=0.0, max_new_tokens_per_turn=64, max_total_tokens=1024)
    backend = HFBackend(policy, sampling, seed=settings.seed)
    rollout = RolloutConfig(batch_size=n, group_size=1, sampling=sampling)
    tasks = arithmetic_tasks("tool", n, settings.seed + 104729)
    episodes, _ = RolloutEngine(backend, factory, rollout).run(tasks)
    calls = [e.metrics["tool_calls"] for e in episodes]
    correct = [number_reward(e.turns[-1].action, t.answers[0]) for e, t in zip(episodes, tasks)]
    return {"greedy_tool_calls_per_episode": sum(calls) / n, "greedy_correct": sum(correct) / n}


def _save_atomically(target: Path, model: Any, tokenizer: Any, extra: dict[str, str] | None = None) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        for name, text in (extra or {}).items():
            (staging / name).write_text(text)
        if target.exists():  # a concurrent run finished first; keep theirs
            shutil.rmtree(staging)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tool", action="store_true", help="also build the SFT-warmed tool checkpoint")
    parser.add_argument("--sft-steps", type=int, default=SFTSettings.steps)
    parser.add_argument("--sft-examples", type=int, default=SFTSettings.examples)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    base = base_model_dir(args.model)
    record: dict[str, Any] = {"event": "prepared", "base": str(base), "tool": None, "sft": None}
    if args.tool:
        settings = SFTSettings(steps=args.sft_steps, examples=args.sft_examples, seed=args.seed)
        tool_dir, record["sft"] = tool_checkpoint(base, settings)
        record["tool"] = str(tool_dir)
    emit(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
