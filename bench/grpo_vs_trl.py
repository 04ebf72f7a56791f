"""ponder vs TRL 1.16 GRPOTrainer, side by side, in one invocation.

    python bench/grpo_vs_trl.py [--workload single|tool|both] [--steps 5] [--warmup 1] [--out results.json]
    python bench/grpo_vs_trl.py --smoke      # tiny random model, a few tokens: checks the harness only

1. Prepares the model directories (bench.prepare): the embedded SmolLM2-135M, and for
   the tool workload the same SFT-warmed checkpoint for both systems.
2. Runs the correctness gate (bench.gate): ponder's loss and gradients must equal
   TRL's on a fixed batch within 1e-5 relative in float64, and ponder's float32
   rounding must be no worse than TRL's own, else no speed ratio is printed.
3. Per workload, starts one worker process per system (bench.worker) and alternates
   them step by step, A B A B: warm-up steps first, then the measured ones. Only one
   step runs at a time; each process's peak RSS is its own.
4. Prints, per system, medians and [min–max] of the step time split into generation /
   logprob recomputation / update / other, completion tokens per second (policy
   tokens only: no padding, no tool output), peak RSS, and the ponder/TRL ratio of
   each pair of steps as median [min–max].

Both systems: same model (fp32, CPU), tokenizer, chat template, prompts in the same
order, group size, max new tokens, temperature (top_p 1, no top_k), seed, LoRA
(r16/α32 on all linear layers, dropout 0), AdamW (lr constant, no decay, clip 1),
PPO clip ε on both sides, β·k3 KL in the loss against adapters-disabled reference,
the matching loss aggregation, one optimizer step per generation batch, and the same
torch thread count.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import LOSS_TYPES, BenchConfig, machine_info, median_spread, paired_ratios, parse_record  # noqa: E402

DEFAULT_MAX_NEW = {"single": 64, "tool": 128}
MIN_MEASURED_STEPS = 5  # issue 4: at least five measured steps per system for a reported result
SYSTEMS = ("ponder", "trl")
ROWS = [  # (label, key); per-step values, derived ones added by `derived`
    ("step time (s)", "step_s"),
    ("  generation (s)", "generation_s"),
    ("  logprob recomputation (s)", "logprob_s"),
    ("  update (s)", "update_s"),
    ("  other: tools, rewards, batching (s)", "other_s"),
    ("completion tokens / step", "completion_tokens"),
    ("completion tokens / s (step)", "tokens_per_s"),
    ("completion tokens / s (generation only)", "generation_tokens_per_s"),
    ("tool calls / episode", "tool_calls_per_episode"),
    ("reward mean", "reward_mean"),
]


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "TQDM_DISABLE": "1",
            "TRL_EXPERIMENTAL_SILENCE": "1",
            "PYTHONWARNINGS": "ignore",
        }
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def run_module(module: str, args: list[str], threads: int, log: Path) -> tuple[int, dict[str, Any]]:
    """Run `python -m module args`; (exit code, its last protocol record). Output goes to `log`."""
    command = [sys.executable, "-m", module, *args]
    done = subprocess.run(command, cwd=ROOT, env=child_env(threads), capture_output=True, text=True)
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}\n")
    records = [r for r in map(parse_record, (done.stdout + "\n").splitlines()) if r is not None]
    if not records:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"{module} failed (exit {done.returncode}): {tail[0]} (full output in {log})")
    return done.returncode, records[-1]


class Worker:
    """One system's worker process; `step()` runs one step and returns its record."""

    def __init__(self, system: str, cfg: BenchConfig, log: Path) -> None:
        self.system, self.log = system, log.open("a")
        command = [sys.executable, "-m", "bench.worker", "--system", system, "--config", cfg.to_json()]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_env(cfg.threads),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )

    def expect(self, event: str) -> dict[str, Any]:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            record = parse_record(line)
            if record is None:
                self.log.write(f"[{self.system}] {line}")
                continue
            if record.get("event") != event:
                raise RuntimeError(
                    f"{self.system} worker sent '{record.get('event')}' while '{event}' was expected"
                )
            return record
        code = self.proc.wait()
        raise SystemExit(
            f"{self.system} worker exited (code {code}) before '{event}'; its output is in {self.log.name}"
        )

    def step(self) -> dict[str, Any]:
        self.proc.stdin.write("step\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.expect("step")

    def finish(self) -> dict[str, Any]:
        record = self.expect("done")
        self.proc.wait()
        self.log.flush()
        return record


def run_pair(cfg: BenchConfig, log: Path, progress: bool) -> dict[str, Any]:
    """Both workers, alternating ponder then TRL each step; warm-up steps are dropped."""
    workers = {system: Worker(system, cfg, log) for system in SYSTEMS}
    try:
        ready = {system: worker.expect("ready") for system, worker in workers.items()}
        steps: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
        for index in range(cfg.warmup + cfg.steps):
            for system in SYSTEMS:
                record = workers[system].step()
                if progress:
                    label = "warm-up" if index < cfg.warmup else "measured"
                    print(
                        f"  [{cfg.workload}] {system:6s} step {index + 1} ({label}): "
                        f"{record['step_s']:.2f} s, "
                        f"{record['completion_tokens']:.0f} tokens",
                        flush=True,
                    )
                if index >= cfg.warmup:
                    steps[system].append(derived(record))
        done = {system: worker.finish() for system, worker in workers.items()}
    finally:
        for worker in workers.values():
            if worker.proc.poll() is None:
                worker.proc.kill()
    return {
        s: {"steps": steps[s], "ready_rss_mb": ready[s]["peak_rss_mb"], "peak_rss_mb": done[s]["peak_rss_mb"],
            "peak_gpu_mb": done[s].get("peak_gpu_mb", 0.0)}
        for s in SYSTEMS
    }


def derived(record: dict[str, Any]) -> dict[str, Any]:
    out = dict(record)
    tokens = record["completion_tokens"]
    out["tokens_per_s"] = tokens / record["step_s"] if record["step_s"] > 0 else float("nan")
    out["generation_tokens_per_s"] = (
        tokens / record["generation_s"] if record["generation_s"] > 0 else float("nan")
    )
    return out


def summarise(pair: dict[str, Any]) -> dict[str, Any]:
    """Per metric: each system's (median, min, max) and the paired ponder/TRL ratios'."""
    summary: dict[str, Any] = {}
    for _, key in ROWS:
        values = {s: [step[key] for step in pair[s]["steps"]] for s in SYSTEMS}
        summary[key] = {s: median_spread(values[s]) for s in SYSTEMS}
        summary[key]["ratio"] = median_spread(paired_ratios(values["ponder"], values["trl"]))
    for key in ("peak_rss_mb", "peak_gpu_mb"):
        peak = {s: pair[s][key] for s in SYSTEMS}
        summary[key] = {s: (peak[s], peak[s], peak[s]) for s in SYSTEMS}
        ratio = peak["ponder"] / peak["trl"] if peak["trl"] > 0 else float("nan")
        summary[key]["ratio"] = (ratio, ratio, ratio)
    return summary


def _cell(stats: tuple[float, float, float], digits: int = 2) -> str:
    median, low, high = stats
    return f"{median:.{digits}f} [{low:.{digits}f}–{high:.{digits}f}]"


def table(summary: dict[str, Any], with_ratios: bool) -> str:
    """A markdown table: ponder, TRL and (if the gate passed) ponder/TRL columns."""
    head = "| metric | ponder | TRL |" + (" ponder/TRL |" if with_ratios else "")
    lines = [head, "|---|---|---|" + ("---|" if with_ratios else "")]
    peaks = [("peak RSS (MiB)", "peak_rss_mb")]
    if "peak_gpu_mb" in summary and summary["peak_gpu_mb"]["trl"][0] > 0:  # a GPU run
        peaks.append(("peak GPU memory (MiB)", "peak_gpu_mb"))
    for label, key in ROWS + peaks:
        digits = 0 if key in ("completion_tokens", "peak_rss_mb", "peak_gpu_mb") else 2
        cells = [_cell(summary[key]["ponder"], digits), _cell(summary[key]["trl"], digits)]
        if with_ratios:
            cells.append(_cell(summary[key]["ratio"], 3))
        lines.append(f"| {label.strip()} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=("single", "tool", "both"), default="both")
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, tiny or a local HF directory")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: both systems on the GPU (see --dtype)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the base weights' dtype on both sides (LoRA weights stay float32)")
    parser.add_argument("--gate-model", default=None,
                        help="the correctness gate's model (default --model; the gate runs in float64 on the "
                             "CPU, so give `tiny` for a model too large for that)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per system (after warm-up)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--prompts", type=int, default=64, help="task pool size")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: 64 single, 128 tool")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--loss-type", choices=sorted(LOSS_TYPES), default="dapo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--micro-batch", type=int, default=4,
                        help="ponder's episodes per forward/backward in the update (0: whole batch, one pass)")
    parser.add_argument("--decoder", default="auto", help="ponder's rollout.sampling.decoder")
    parser.add_argument("--activation-offload", action="store_true", help="ponder's model.activation_offload")
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--sft-examples", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="write all results as JSON here")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, 2 steps, 8 tokens: harness check only"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.steps, args.warmup, args.prompts, args.sft_steps, args.sft_examples = (
            "tiny",
            2,
            1,
            8,
            2,
            8,
        )
        args.max_new_tokens = args.max_new_tokens or 8
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be ≥ 1 and --warmup ≥ 0")
    return args


def workload_config(args: argparse.Namespace, workload: str, model_dir: str) -> BenchConfig:
    return BenchConfig(
        workload=workload,
        model=model_dir,
        prompts=args.prompts,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW[workload],
        max_turns=args.max_turns,
        temperature=args.temperature,
        seed=args.seed,
        lr=args.lr,
        beta=args.beta,
        loss_type=args.loss_type,
        threads=args.threads,
        micro_batch=args.micro_batch,
        warmup=args.warmup,
        steps=args.steps,
        device=args.device,
        dtype=args.dtype,
        decoder=args.decoder,
        activation_offload=args.activation_offload,
    )


def prepare_and_gate(args: argparse.Namespace, workloads: list[str], log: Path) -> tuple[dict, dict]:
    """Model directories (bench.prepare) and the correctness gate's record (bench.gate)."""
    prepare_args = _flags(
        model=args.model,
        seed=args.seed,
        threads=args.threads,
        sft_steps=args.sft_steps,
        sft_examples=args.sft_examples,
    ) + (["--tool"] if "tool" in workloads else [])
    _, prepared = run_module("bench.prepare", prepare_args, args.threads, log)
    if prepared.get("sft"):
        print(f"tool workload checkpoint (SFT warm-up): {json.dumps(prepared['sft'])}", flush=True)
    gate_model = prepared["base"]
    if args.gate_model:
        _, gated = run_module("bench.prepare", _flags(model=args.gate_model, seed=args.seed, threads=args.threads),
                              args.threads, log)  # fmt: skip
        gate_model = gated["base"]
    gate_args = _flags(
        model=gate_model,
        loss_type=args.loss_type,
        beta=args.beta,
        temperature=args.temperature,
        seed=args.seed,
    )
    _, gate = run_module("bench.gate", gate_args, args.threads, log)
    print(_gate_line(gate), flush=True)
    return prepared, gate


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        raise SystemExit("trl is not installed: run `make bench-setup` (pip install -e '.[bench]')")
    workloads = ["single", "tool"] if args.workload == "both" else [args.workload]
    log = Path(tempfile.mkdtemp(prefix="grpo-vs-trl-")) / "workers.log"
    print(f"machine: {json.dumps(machine_info())}\nworker output: {log}", flush=True)
    if args.steps < MIN_MEASURED_STEPS:
        print(
            f"note: {args.steps} measured steps (< {MIN_MEASURED_STEPS}): a validation run, not a result",
            flush=True,
        )
    prepared, gate = prepare_and_gate(args, workloads, log)
    results: dict[str, Any] = {
        "command": sys.argv,
        "machine": machine_info(),
        "gate": gate,
        "sft": prepared.get("sft"),
        "workloads": {},
    }
    for workload in workloads:
        model_dir = prepared["tool"] if workload == "tool" else prepared["base"]
        cfg = workload_config(args, workload, model_dir)
        print(f"\n## workload: {workload}\nconfig: {cfg.to_json()}", flush=True)
        pair = run_pair(cfg, log, progress=True)
        summary = summarise(pair)
        _check_threads(pair, cfg.threads)
        print(table(summary, with_ratios=gate["passed"]), flush=True)
        if not gate["passed"]:  # no ratio leaves this process without a passing gate
            summary = {
                key: {s: v for s, v in cells.items() if s != "ratio"} for key, cells in summary.items()
            }
        results["workloads"][workload] = {
            "config": json.loads(cfg.to_json()),
            "runs": pair,
            "summary": summary,
        }
    if not gate["passed"]:
        print("\nthe correctness gate failed: no speed ratios are reported", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
        print(f"\nresults: {args.out}")
    return 0 if gate["passed"] else 1


def _flags(**options: Any) -> list[str]:
    """`--name value` pairs for a child module (underscores in names become dashes)."""
    out: list[str] = []
    for name, value in options.items():
        out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def _gate_line(gate: dict[str, Any]) -> str:
    verdict = "PASS" if gate["passed"] else "FAIL"
    return (
        f"correctness gate {verdict}: TRL loss_type={gate['loss_type']} vs ponder {gate['aggregation']}, "
        f"float64: loss rel diff {gate['loss_rel']:.1e}, gradient rel diff {gate['grad_rel_global']:.1e} "
        f"(largest per tensor {gate['grad_rel_max']:.1e} over {gate['tensors']} adapter tensors); "
        f"float32: gradient rel diff {gate['fp32_grad_rel']:.1e}, rounding vs float64 ponder "
        f"{gate['fp32_ponder_error']:.1e}, TRL {gate['fp32_trl_error']:.1e}; tolerance {gate['tolerance']:g}"
    )


def _check_threads(pair: dict[str, Any], threads: int) -> None:
    seen = {s: sorted({step["threads"] for step in pair[s]["steps"]}) for s in SYSTEMS}
    if any(values != [threads] for values in seen.values()):
        print(f"warning: torch threads differ from --threads {threads}: {seen}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
