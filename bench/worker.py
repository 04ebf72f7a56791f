"""One system's process in the side-by-side benchmark.

    python -m bench.worker --system ponder|trl --config '<BenchConfig JSON>'

Protocol (stdout lines starting with common.MARK; anything else is library output):
the worker sets up, announces {"event": "ready"}, then for each of warmup + steps
steps reads a line `step` from stdin, runs one GRPO step and answers
{"event": "step", ...timings}; at the end it answers {"event": "done",
"peak_rss_mb": ...}. The orchestrator alternates the two workers step by step, so
each step runs alone on the machine, and each process's peak RSS is its own.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from bench.common import BenchConfig, emit, peak_gpu_mb, peak_rss_mb


class Channel:
    """Reads go-aheads from stdin and writes protocol records to stdout."""

    def __init__(self) -> None:
        self.ready_sent = False

    def wait(self) -> None:
        if not self.ready_sent:
            emit({"event": "ready", "peak_rss_mb": peak_rss_mb()})
            self.ready_sent = True
        command = sys.stdin.readline().strip()
        if command != "step":
            raise SystemExit(f"worker: expected 'step' on stdin, got {command!r}")

    def report(self, record: dict[str, Any]) -> None:
        import torch

        emit({"event": "step", "threads": torch.get_num_threads(), **record})
        if torch.cuda.is_available():  # the other system's step runs next on the same GPU:
            torch.cuda.empty_cache()  # give back what this one's allocator keeps cached (untimed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--system", choices=("ponder", "trl"), required=True)
    parser.add_argument("--config", required=True, help="BenchConfig as JSON")
    args = parser.parse_args(argv)
    cfg = BenchConfig.from_json(args.config)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    channel = Channel()
    if args.system == "ponder":
        from bench.ponder_side import PonderSide

        side = PonderSide(cfg)
        for _ in range(cfg.warmup + cfg.steps):
            channel.wait()
            channel.report(side.step())
    else:
        from bench.trl_side import TRLSide

        TRLSide(cfg).run(channel.wait, channel.report)
    emit({"event": "done", "peak_rss_mb": peak_rss_mb(), "peak_gpu_mb": peak_gpu_mb()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
