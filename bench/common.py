"""What both sides of the GRPO benchmark share: the run settings, the loss-type
mapping, the worker line protocol, peak RSS and the median/spread statistics.

Imports nothing heavy (no torch, no TRL) so the orchestrator stays a small process.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import sys
from dataclasses import dataclass
from typing import IO, Any

#: Prefix of protocol lines on a worker's stdout; everything else there is library chatter.
MARK = "@@bench@@ "

#: TRL loss_type → ponder aggregation with the same normalisation (one micro-batch per step,
#: no empty rows): dapo and bnpo divide by the batch's policy tokens, grpo averages each
#: sequence's token mean, dr_grpo divides token sums by rows × max_completion_length.
LOSS_TYPES = {
    "dapo": "token_mean",
    "bnpo": "token_mean",
    "grpo": "seq_mean_token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}

WORKLOADS = ("single", "tool")


@dataclass
class BenchConfig:
    """One side-by-side run; both systems read the same object.

    workload: `single` (arithmetic, one answer) or `tool` (calculator calls, multi-turn).
    model: local HF model directory both systems load (fp32).
    prompts: size of the task pool (steps take prompts in order, cycling).
    prompts_per_step / group_size: GRPO batch = prompts_per_step × group_size completions.
    max_new_tokens: TRL's max_completion_length; ponder's per-turn cap, and its
        prompt + response cap is the longest prompt plus this.
    max_turns: model turns per episode (tool workload); TRL gets max_turns − 1 tool iterations.
    temperature: sampling temperature (top_p 1, no top_k on both).
    seed: task generation, sampling and LoRA initialisation seed.
    lr: AdamW learning rate (constant, no warm-up, weight decay 0, grad-norm clip 1).
    beta: KL coefficient (k3 estimator, in the loss, reference = adapters disabled).
    loss_type: TRL loss_type; ponder uses LOSS_TYPES[loss_type] with the same PPO clip.
    epsilon: PPO clip, symmetric (TRL epsilon = epsilon_high; ponder clip_low = clip_high).
    lora_r / lora_alpha: LoRA on every linear layer but the LM head, dropout 0, on both.
    threads: torch.set_num_threads in each worker.
    micro_batch: ponder's episodes per forward/backward in the update (gradient
        accumulation, the same gradient as one pass; 0 = the whole batch in one pass,
        as TRL does here). Smaller micro-batches bound the update's activation memory;
        docs/results/benchmarks.md reports the default, 4, and the peak memory with 2.
    warmup / steps: unmeasured then measured steps per system.
    device / dtype: where both systems run (`cpu` float32 by default; `cuda`
        bfloat16 on a GPU: the base weights in bf16 on both, LoRA weights float32).
    decoder: ponder's `rollout.sampling.decoder` (TRL generates with transformers).
    activation_offload: ponder's `model.activation_offload` (its peak GPU memory).
    """

    workload: str = "single"
    model: str = ""
    prompts: int = 64
    prompts_per_step: int = 2
    group_size: int = 4
    max_new_tokens: int = 64
    max_turns: int = 3
    temperature: float = 1.0
    seed: int = 0
    lr: float = 1e-5
    beta: float = 0.04
    loss_type: str = "dapo"
    epsilon: float = 0.2
    lora_r: int = 16
    lora_alpha: int = 32
    threads: int = 2
    micro_batch: int = 4
    warmup: int = 1
    steps: int = 5
    device: str = "cpu"
    dtype: str = "float32"
    decoder: str = "auto"
    activation_offload: bool = False

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload '{self.workload}'; valid: {', '.join(WORKLOADS)}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type '{self.loss_type}'; valid: {', '.join(LOSS_TYPES)}")

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        return cls(**json.loads(text))


def emit(record: dict[str, Any], stream: IO[str] | None = None) -> None:
    """Write one protocol record (a JSON object on a MARK-prefixed line) and flush."""
    out = stream or sys.stdout
    out.write(MARK + json.dumps(record) + "\n")
    out.flush()


def parse_record(line: str) -> dict[str, Any] | None:
    """The record on a protocol line, or None for any other output line. The mark may
    follow other text on the same line (a progress bar ending in a carriage return)."""
    at = line.find(MARK)
    return json.loads(line[at + len(MARK) :]) if at >= 0 else None


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory and library versions, without importing torch."""
    import os
    import platform
    from importlib import metadata

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    memory_gib = float("nan")
    try:
        with open("/proc/meminfo") as handle:
            total_kib = next(int(line.split()[1]) for line in handle if line.startswith("MemTotal"))
        memory_gib = round(total_kib / 1024**2, 1)
    except (OSError, StopIteration):
        pass
    versions = {}
    for package in ("torch", "transformers", "peft", "trl"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "os": platform.platform(),
        **versions,
    }


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_gpu_mb() -> float:
    """This process's peak CUDA memory allocated by torch in MiB (0 without a GPU)."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0


def median_spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of values; NaNs for an empty list."""
    if not values:
        nan = float("nan")
        return nan, nan, nan
    return statistics.median(values), min(values), max(values)


def paired_ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """a_i / b_i for the i-th measured step of each system (A B A B pairs); a zero
    denominator gives inf (or nan for 0/0) rather than an exception."""
    if len(numerators) != len(denominators):
        raise ValueError(f"unpaired steps: {len(numerators)} vs {len(denominators)}")
    out = []
    for a, b in zip(numerators, denominators):
        out.append(a / b if b else (float("nan") if a == 0 else float("inf")))
    return out
