"""fp32 matrix products on the CPU through whichever of torch's two libraries is faster here.

Why: torch's fp32 `F.linear` on the CPU is MKL's sgemm. On AMD processors MKL takes
its AVX2 path even where the CPU has AVX-512: on a 2-core AMD EPYC (Zen 5) sgemm ran
at ~190 GFLOP/s at the update's shapes and streamed the decode step's weights at
9-16 GB/s, where oneDNN, which ships inside torch too, ran at 400-470 GFLOP/s and
35-78 GB/s (docs/results/benchmarks.md). On the Intel Xeons measured earlier the two were
close, and oneDNN lost on square matrices at one row. So the choice is measured, not
assumed: once per machine (per row-count bucket, on a probe product), and kept in
`$PONDER_CACHE_DIR/matmul-<cpu>.json`. Kept, because the two libraries round
differently: a choice re-measured in every process flips under a loaded CPU, and a
resumed run would then no longer be bit-identical to an uninterrupted one.

- `linear(x, weight, bias)`: x @ weightᵀ + bias with either library; `weight` may be
  a transposed view (oneDNN reads the strides, no copy). No autograd: callers wrap
  it in their own autograd functions (models/lora_fused.py).
- `packing_wins(weight)`: whether oneDNN's blocked weight layout beats `linear` for
  this weight at the decode step's row counts (the lean decoder's choice).

`PONDER_MATMUL=blas|onednn|auto` (default auto) forces one library, for A/B runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

# oneDNN keeps a compiled primitive per operand shape, 1024 by default. Training passes
# meet a new sequence length at almost every micro-batch, so the cache filled with
# shapes never seen again: ~0.35 GB more RSS by the end of the demo's SFT
# (docs/results/search-qa.md, "Cost"). One pass needs a few dozen shapes (every projection,
# forward and backward), a decode step fewer. oneDNN reads the variable when it makes
# its first primitive; a value the user set wins.
PRIMITIVE_CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
os.environ.setdefault(PRIMITIVE_CACHE, "64")

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


def bf16_packable(weight: torch.Tensor) -> bool:
    """A bf16 CPU weight oneDNN can pack: its bf16 kernels are the ones to use (plain
    `F.linear` in bf16 measured 1.5x slower than the packed weight on the vocabulary head)."""
    return (
        weight.dtype == torch.bfloat16
        and weight.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX-512 BF16 or AMX), which
    oneDNN's bf16 kernels need to beat fp32 (without them it emulates bf16)."""
    return has_bf16_instructions((_cpuinfo("flags") or "").split())


def has_bf16_instructions(flags: list[str]) -> bool:
    """From /proc/cpuinfo's flags: AVX-512 BF16 or AMX's bf16 tiles."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


MATMUL_DTYPES = ("model", "auto", "float32", "bfloat16")


def check_matmul_dtype(name: str, setting: str) -> None:
    """ValueError naming `setting` for a precision that is not one of MATMUL_DTYPES."""
    if name not in MATMUL_DTYPES:
        raise ValueError(f"{setting}: unknown '{name}'; valid: {', '.join(MATMUL_DTYPES)}")


def matmul_dtype(name: str, setting: str, weights: torch.dtype, device: torch.device) -> torch.dtype:
    """A recipe's precision for matrix products (`setting` names it in errors): `model`
    is the weights' own; `auto` bfloat16 for float32 weights on a CPU with bf16
    instructions, else the weights'."""
    check_matmul_dtype(name, setting)
    if name == "model":
        return weights
    if name != "auto":
        return getattr(torch, name)
    on_bf16_cpu = device.type == "cpu" and weights == torch.float32 and native_bf16()
    return torch.bfloat16 if on_bf16_cpu else weights


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
    """Measured once per bucket and machine: is oneDNN faster than sgemm on the probe product?"""

    def measure() -> bool:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(rows, _PROBE_SIZE, generator=generator)
        weight = torch.randn(_PROBE_SIZE, _PROBE_SIZE, generator=generator)
        onednn = best_time(lambda: onednn_linear(x, weight))
        return onednn < best_time(lambda: F.linear(x, weight))

    return _verdict(f"linear/{rows}", measure)


def _cpuinfo(field: str) -> str | None:
    """The first value of `field` in /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            return next((line.split(":", 1)[1] for line in info if line.startswith(field)), None)
    except OSError:
        return None


def _verdict_file() -> Path:
    """This machine's verdicts: one file per CPU model and torch version."""
    cpu = _cpuinfo("model name") or platform.processor() or platform.machine()
    tag = hashlib.sha256(f"{cpu.strip()}|{torch.__version__}".encode()).hexdigest()[:12]
    root = Path(os.environ.get("PONDER_CACHE_DIR", Path.home() / ".cache" / "ponder"))
    return root / f"matmul-{tag}.json"


def _verdict(key: str, measure: Callable[[], bool]) -> bool:
    """The kept verdict for `key`, measured and kept (first writer wins) when there is none."""
    path = _verdict_file()
    kept = _read_verdicts(path)
    if key in kept:
        return kept[key]
    value = measure()
    kept = _read_verdicts(path)  # another process may have decided meanwhile: its verdict wins
    if key not in kept:
        kept[key] = value
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(kept, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: the verdict holds for this process only
    return kept[key]


def _read_verdicts(path: Path) -> dict[str, bool]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, bool)} if isinstance(data, dict) else {}


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

        def measure() -> bool:
            inputs = [torch.randn(rows, weight.shape[1]) for rows in _DECODE_ROWS]
            blocked = sum(best_time(lambda x=x: onednn_linear(x, packed)) for x in inputs)
            return blocked < sum(best_time(lambda x=x: linear(x, weight)) for x in inputs)

        _PACKING_VERDICTS[shape] = _verdict("pack/" + "x".join(map(str, shape)), measure)
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
