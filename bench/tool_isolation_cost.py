"""Per-call cost of tool isolation: `ToolRegistry.call` of a trivial tool in "thread"
mode against "process" mode (one fork per call), in a small process and next to a
loaded model (fork copies the page tables of everything this process holds).

    python bench/tool_isolation_cost.py [--calls 50] [--model smollm2-135m] [--out FILE]

Prints the median and the spread (min, max) of each, in milliseconds, as JSON;
docs/results/safety.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ponder.tools import ToolRegistry, tool
from ponder.types import ToolCall


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


def _times_ms(isolation: str, calls: int) -> dict[str, float]:
    registry = ToolRegistry([add], isolation=isolation)
    call = ToolCall("add", {"a": 2, "b": 3})
    registry.call(call)  # warm-up: imports, first thread
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        result = registry.call(call)
        times.append((time.perf_counter() - started) * 1000)
        assert result.content == "5", result
    return {"median_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3),
            "max_ms": round(max(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--model", default="smollm2-135m", help="policy to load for the second measurement")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    report = {"calls": args.calls, "small_process": {m: _times_ms(m, args.calls) for m in ("thread", "process")}}
    from ponder.models import load_policy

    policy = load_policy(args.model)
    report["with_model"] = {"model": args.model, **{m: _times_ms(m, args.calls) for m in ("thread", "process")}}
    del policy
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
