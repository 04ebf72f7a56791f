"""How many threads a CPU decode step should use when other work shares the cores.

Why: torch's OpenMP threads spin-wait at the end of every parallel region for the
other threads of their team. A decode step is hundreds of short regions. When
another process holds a core, the thread that was descheduled makes every region
wait for the scheduler. Measured on the 2-core machine with a load average of 6-8
from other jobs, SmolLM2 decoding at batch 1 (docs/benchmarks.md, "Under CPU
contention"):
- 2 threads: 0.9 tokens/s;
- 1 thread: 7.2 tokens/s;
- 2 threads with OMP_WAIT_POLICY=PASSIVE: 6.6 tokens/s.
On an idle machine, 2 threads are the faster choice. So the thread count follows
the load: `decode_threads()` leaves torch's setting alone while the other processes'
load leaves the cores free, and drops to the cores they leave (at least one) when
it does not.

`PONDER_DECODE_THREADS=auto|N` (default auto) forces a count, for A/B runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

ENV_VAR = "PONDER_DECODE_THREADS"


def free_cores(load: float, own_threads: int, cores: int) -> float:
    """Cores the other processes leave free: the 1-minute load average less this
    process's own busy threads (a trainer computes nearly all the time)."""
    others = max(load - own_threads, 0.0)
    return cores - others


def threads_for(load: float, own_threads: int, cores: int) -> int:
    """The thread count for a decode step: the current one while the others leave
    that many cores free, else the free cores rounded, at least 1."""
    return max(1, min(own_threads, round(free_cores(load, own_threads, cores))))


def decode_threads() -> int:
    """Threads for the next CPU decode call (PONDER_DECODE_THREADS, else by load)."""
    forced = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if forced != "auto":
        if not forced.isdigit() or int(forced) < 1:
            raise ValueError(f"{ENV_VAR}={forced!r}: give auto or a thread count >= 1")
        return int(forced)
    own = torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # no load average on this platform: leave torch's count
        return own
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return threads_for(load, own, cores)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch.set_num_threads(count) inside the block, the previous count after it."""
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count != before:
            torch.set_num_threads(before)
