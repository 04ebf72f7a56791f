"""fp32 matrix products on the CPU through whichever of torch's two libraries is faster here.

Why: torch's fp32 `F.linear` on the CPU is MKL's sgemm. On AMD processors MKL takes
its AVX2 path even where the CPU has AVX-512: on a 2-core AMD EPYC (Zen 5) sgemm ran
at ~190 GFLOP/s at the update's shapes and streamed the decode step's weights at
9-16 GB/s, where oneDNN, which ships inside torch too, ran at 400-470 GFLOP/s and
35-78 GB/s (docs/benchmarks.md). On the Intel Xeons measured earlier the two were
close, and oneDNN lost on square matrices at one row. So the choice is measured once
per process (per row-count bucket, on a probe product), not assumed.

- `linear(x, weight, bias)`: x @ weightᵀ + bias with either library; `weight` may be
  a transposed view (oneDNN reads the strides, no copy). No autograd: callers wrap
  it in their own autograd functions (models/lora_fused.py).
- `packing_wins(weight)`: whether oneDNN's blocked weight layout beats `linear` for
  this weight at the decode step's row counts (the lean decoder's choice).

`PONDER_MATMUL=blas|onednn|auto` (default auto) forces one library, for A/B runs.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F

KERNELS = ("auto", "blas", "onednn")
ENV_VAR = "PONDER_MATMUL"
# Row counts of the lean decoder's steps that packing must win on (one row, a GRPO batch).
_DECODE_ROWS = (1, 8)
# The batch size the blocked layout is tuned for (any batch size works with it; hints
# of 8, 32 and 128 measured the same on SmolLM2 at batch 8, 32 and 128).
_PACK_BATCH_HINT = 32
_PROBE_SIZE = 768  # probe product: [rows, 768] @ [768, 768]ᵀ, the size of a small model's layer


def kernel_choice() -> str:
    """`auto`, `blas` or `onednn`, from PONDER_MATMUL; an unknown value is refused."""
    choice = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in KERNELS:
        raise ValueError(f"{ENV_VAR}={choice!r} is not a matmul kernel; valid: {', '.join(KERNELS)}")
    return choice


def onednn_usable(*tensors: torch.Tensor) -> bool:
    """oneDNN can take these: fp32 CPU tensors, and torch was built with it."""
    return (
        all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]ᵀ (+ bias [out]) -> [..., out], by the faster library."""
    if onednn_usable(x, weight) and _prefer_onednn(x.numel() // max(x.shape[-1], 1)):
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _prefer_onednn(rows: int) -> bool:
    choice = kernel_choice()
    if choice != "auto":
        return choice == "onednn"
    return _onednn_faster(1 << min(max(rows - 1, 0).bit_length(), 9))  # buckets 1, 2, 4 … 512


@functools.lru_cache(maxsize=None)
def _onednn_faster(rows: int) -> bool:
    """Measured once per bucket: is oneDNN faster than sgemm on the probe product?"""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, _PROBE_SIZE, generator=generator)
    weight = torch.randn(_PROBE_SIZE, _PROBE_SIZE, generator=generator)
    onednn = best_time(lambda: onednn_linear(x, weight))
    return onednn < best_time(lambda: F.linear(x, weight))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout (for `onednn_linear`)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_BATCH_HINT)


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weightᵀ + bias on oneDNN; `weight` plain (any strides) or from `pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def packing_wins(weight: torch.Tensor, packed: torch.Tensor) -> bool:
    """Whether the blocked copy `packed` of `weight` [out, in] beats `linear` on it,
    summed over the decode step's row counts; measured once per weight shape."""
    choice = kernel_choice()
    if choice != "auto":
        return choice == "onednn"
    shape = tuple(weight.shape)
    if shape not in _PACKING_VERDICTS:
        inputs = [torch.randn(rows, weight.shape[1]) for rows in _DECODE_ROWS]
        blocked = sum(best_time(lambda x=x: onednn_linear(x, packed)) for x in inputs)
        _PACKING_VERDICTS[shape] = blocked < sum(best_time(lambda x=x: linear(x, weight)) for x in inputs)
    return _PACKING_VERDICTS[shape]


_PACKING_VERDICTS: dict[tuple[int, ...], bool] = {}


def best_time(fn: Callable[[], object], reps: int = 5) -> float:
    """Fastest of `reps` timed calls after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        tick = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tick)
    return min(times)
