"""Per-call cost of the code jail: a cold `run_python` (a new bubblewrap jail per call)
against `SandboxPool.run` (a warm jail, one fork per call), for `print(1)`.

    python bench/sandbox_cost.py [--calls 20] [--out runs/bench/sandbox_cost.json]

Reports the median and the spread (min, max) of the wall-clock time of each call, as
seen by the caller; docs/results/safety.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ponder.tools.sandbox import SandboxPool, run_python


def _timed(call, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
        assert result.stdout == "1\n", result
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cold = _timed(lambda: run_python("print(1)"), args.calls)
    with SandboxPool(size=1) as pool:
        pool.run("print(1)")  # the first call of a fresh jail pays its page faults
        warm = _timed(lambda: pool.run("print(1)"), args.calls)
    report = {}
    for name, times in (("cold run_python", cold), ("SandboxPool.run", warm)):
        report[name] = {
            "median_ms": 1000 * statistics.median(times),
            "min_ms": 1000 * min(times),
            "max_ms": 1000 * max(times),
            "calls": len(times),
        }
        print(
            f"{name:16s} median {report[name]['median_ms']:7.1f} ms  (min {report[name]['min_ms']:.1f}, "
            f"max {report[name]['max_ms']:.1f}, {len(times)} calls)"
        )
    report["speedup"] = report["cold run_python"]["median_ms"] / report["SandboxPool.run"]["median_ms"]
    print(f"warm pool is {report['speedup']:.1f}x faster per call")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
