"""glibc's heap on the CPU path: giving freed memory back to the system between
stages and steps, and mapping large blocks so that a training pass's freed
activations leave the resident set instead of fragmenting the heap."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from typing import Any

# glibc's mallopt parameter (malloc.h) and the threshold ponder sets: blocks of at least
# this many bytes are mapped on allocation and unmapped on free.
M_MMAP_THRESHOLD = -3
LARGE_BLOCK = 1 << 20
THRESHOLD_ENV = "PONDER_MMAP_THRESHOLD"


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (e.g. musl, macOS): nothing to tune
        return None


def trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def release_memory() -> None:
    """Hand a finished stage's freed memory back to the system: glibc keeps freed
    activations and KV caches in its arenas, so the peak RSS of every later stage
    would start from the biggest earlier one."""
    gc.collect()
    trim_heap()


def map_large_blocks() -> int:
    """Fix glibc's mmap threshold at 1 MiB (PONDER_MMAP_THRESHOLD=N bytes for another
    value, 0 to leave glibc's own; a MALLOC_MMAP_THRESHOLD_ the user set wins).
    Returns the threshold set, 0 when none was.

    glibc starts at 128 KiB but raises the threshold to the size of every mapped
    block freed, up to 32 MiB: after the first training pass, a row's activations
    (0.3-4 MB each on SmolLM2) come from the heap, and rows of other lengths leave it
    fragmented, so the resident set grows step after step (docs/results/search-qa.md, "Cost":
    the demo policy's training passes, 3.35 GB peak against 2.90 GB with this).
    """
    libc = _libc()
    value = os.environ.get(THRESHOLD_ENV, str(LARGE_BLOCK))
    if not value.strip().isdigit():
        raise ValueError(f"{THRESHOLD_ENV}={value!r}: give a number of bytes (0 = glibc's own threshold)")
    threshold = int(value)
    if libc is None or threshold <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return 0
    return threshold if libc.mallopt(M_MMAP_THRESHOLD, threshold) == 1 else 0


def peak_rss_gb() -> float:
    """The process's peak resident set so far, in GB (0.0 where `resource` is missing)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9


def peak_gpu_gb() -> float:
    """torch's peak GPU allocation so far, in GB (0.0 until CUDA is in use)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0.0
    return torch.cuda.max_memory_allocated() / 1e9


def peak_memory() -> dict[str, float]:
    """The process's peaks so far, in GB: `rss` (the resident set) and, once CUDA is in
    use, `gpu` (torch's allocations). What a stage records as it ends."""
    gpu = peak_gpu_gb()
    return {"rss": peak_rss_gb(), **({"gpu": gpu} if gpu else {})}
