"""Giving freed memory back to the system between stages and steps."""

from __future__ import annotations


def release_memory() -> None:
    """Hand a finished stage's freed memory back to the system: glibc keeps freed
    activations and KV caches in its arenas, so the peak RSS of every later stage
    would start from the biggest earlier one."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
