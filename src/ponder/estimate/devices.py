"""The devices an estimate is made for: GPUs from their published peaks, the CPU
from a calibration of this machine (or a conservative default), each with the
share of its peak a training or decoding pass is assumed to reach."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ponder.fileio import write_json_atomic


@dataclass(frozen=True)
class Device:
    """One accelerator (or the CPU) as the estimate sees it.

    name: the --device name. label: what it is. bf16_tflops / fp32_tflops: peak dense
    matrix throughput (no sparsity) in that precision. bandwidth_gbs: memory bandwidth,
    GB/s. memory_gb: memory of one device. bf16: computes in bfloat16 (model.dtype auto
    picks it). compute_util: share of the peak a training or prefill pass reaches (MFU).
    bandwidth_util: share of the bandwidth a decode step reaches. source: where the
    figures come from.
    """

    name: str
    label: str
    bf16_tflops: float
    fp32_tflops: float
    bandwidth_gbs: float
    memory_gb: float
    bf16: bool = True
    compute_util: float = 0.1
    bandwidth_util: float = 0.3
    source: str = ""

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"

    def flops_per_s(self, bytes_per_value: int) -> float:
        """Achieved FLOP/s for matrices of that width (2: bf16/fp16, 4: fp32)."""
        peak = self.bf16_tflops if bytes_per_value == 2 else self.fp32_tflops
        return peak * 1e12 * self.compute_util

    def bytes_per_s(self) -> float:
        return self.bandwidth_gbs * 1e9 * self.bandwidth_util


# The GPUs' utilisation defaults (Device.compute_util 0.1, bandwidth_util 0.3) are what
# ponder measured on a 1.5B model (docs/results/benchmarks.md, "On a GPU"): decode at
# 14-31 % of the H200's HBM roofline, the GRPO update on an H100 at ~4-9 % of the bf16
# peak (launch-bound micro-batches). Large models and batches reach more (40-50 % MFU is
# usual for pretraining): --mfu and --bandwidth-util set them.
# Peak dense figures from NVIDIA's datasheets (the sparsity figures they also print
# are twice these): H100 Tensor Core GPU datasheet (SXM5 and PCIe), H200 Tensor Core
# GPU datasheet (SXM), A100 Tensor Core GPU datasheet (SXM 80GB and 40GB), L4, L40S
# and A10 Tensor Core GPU datasheets, T4 datasheet (fp16; no bf16), and the Ada
# Lovelace architecture whitepaper for the RTX 4090 (fp16/bf16 with fp32 accumulate).
GPUS = (
    Device("h100", "NVIDIA H100 SXM5 80GB", 989.0, 67.0, 3350.0, 80.0, source="H100 datasheet"),
    Device("h100-pcie", "NVIDIA H100 PCIe 80GB", 756.0, 51.0, 2000.0, 80.0, source="H100 datasheet"),
    Device("h200", "NVIDIA H200 SXM 141GB", 989.0, 67.0, 4800.0, 141.0, source="H200 datasheet"),
    Device("a100", "NVIDIA A100 SXM 80GB", 312.0, 19.5, 2039.0, 80.0, source="A100 datasheet"),
    Device("a100-40gb", "NVIDIA A100 40GB", 312.0, 19.5, 1555.0, 40.0, source="A100 datasheet"),
    Device("l40s", "NVIDIA L40S 48GB", 362.0, 91.6, 864.0, 48.0, source="L40S datasheet"),
    Device("l4", "NVIDIA L4 24GB", 121.0, 30.3, 300.0, 24.0, source="L4 datasheet"),
    Device("a10", "NVIDIA A10 24GB", 125.0, 31.2, 600.0, 24.0, source="A10 datasheet"),
    Device("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 165.2, 82.6, 1008.0, 24.0, source="Ada whitepaper"),
    Device("t4", "NVIDIA T4 16GB", 65.0, 8.1, 320.0, 16.0, bf16=False, source="T4 datasheet (fp16)"),
)
# The CPU's figures are measured (`--calibrate`); these stand in until then: a small
# laptop-class CPU, so an uncalibrated estimate errs towards slow.
CPU_DEFAULT = Device("cpu", "CPU (uncalibrated default)", 0.05, 0.05, 10.0, 0.0, bf16=False, compute_util=0.6,
                     bandwidth_util=0.8, source="conservative default; run --calibrate")  # fmt: skip
CPU_COMPUTE_UTIL = 0.6  # a training pass reaches this share of the calibrated matmul rate
CPU_BANDWIDTH_UTIL = 0.8  # a decode step this share of the calibrated copy bandwidth


def known_devices() -> list[str]:
    return ["cpu", *(gpu.name for gpu in GPUS)]


def gpu(name: str) -> Device:
    """The table's GPU of that name; a one-line ValueError naming the known ones."""
    for device in GPUS:
        if device.name == name.lower():
            return device
    raise ValueError(f"unknown device '{name}'; known: {', '.join(known_devices())}")


def gpu_from_torch_name(torch_name: str) -> Device | None:
    """The table's entry for torch.cuda.get_device_name() (e.g. "NVIDIA H200"), if any."""
    text = torch_name.lower().replace(" ", "")
    for device in sorted(GPUS, key=lambda d: -len(d.name)):  # h100-pcie before h100
        key = device.name.replace("-", "")
        if key in text and ("pcie" in text) == ("pcie" in key) and ("40gb" in text) == ("40gb" in key):
            return device
    return None


def calibration_file() -> Path:
    """One calibration per CPU model, thread count and torch version, in ponder's cache dir."""
    import torch

    cpu = _cpu_model()
    tag = hashlib.sha256(f"{cpu}|{torch.get_num_threads()}|{torch.__version__}".encode()).hexdigest()[:12]
    root = Path(os.environ.get("PONDER_CACHE_DIR", Path.home() / ".cache" / "ponder"))
    return root / f"estimate-cpu-{tag}.json"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            found = next((line.split(":", 1)[1] for line in info if line.startswith("model name")), None)
    except OSError:
        found = None
    return (found or platform.processor() or platform.machine()).strip()


def cpu_from_calibration(measured: dict[str, Any]) -> Device:
    """The CPU Device of a calibration record (calibrate_cpu's dict). Its FLOP/s are the
    fp32 rate in both columns: bf16 products measured many times faster in isolation
    but only ~1.3x in a whole training pass (docs/results/search-qa.md, "Cost"), so
    the estimate does not count on them; bf16 says the CPU has bf16 instructions."""
    fp32 = measured["matmul_gflops"] / 1e3
    return Device("cpu", f"CPU {measured.get('cpu', '')}, {measured.get('threads', '?')} threads (calibrated)",
                  fp32, fp32, measured["bandwidth_gbs"], _total_memory_gb(),
                  bf16=bool(measured.get("bf16_matmul_gflops")), compute_util=CPU_COMPUTE_UTIL,
                  bandwidth_util=CPU_BANDWIDTH_UTIL, source=f"calibration {calibration_file()}")  # fmt: skip


def _total_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 0.0


def this_cpu() -> tuple[Device, bool]:
    """This machine's CPU from its saved calibration, or the default; (device, calibrated)."""
    try:
        measured = json.loads(calibration_file().read_text())
        return cpu_from_calibration(measured), True
    except (OSError, ValueError, KeyError, TypeError):
        return replace(CPU_DEFAULT, memory_gb=_total_memory_gb()), False


def calibrate_cpu(seconds: float = 1.0, copy_mb: int = 256) -> dict[str, Any]:
    """Measure this CPU with torch (a few seconds): fp32 matmul GFLOP/s (1024² products),
    bf16's too where the CPU has bf16 instructions, and copy bandwidth (a copy_mb tensor
    read and written, far larger than any cache); saved to calibration_file() and returned."""
    import torch

    from ponder.models.cpu_matmul import native_bf16

    def rate(fn: Any, work: float) -> float:
        fn()  # warm-up
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            fn()
            done += 1
        return work * done / (time.perf_counter() - started)

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    measured: dict[str, Any] = {"cpu": _cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    measured["matmul_gflops"] = rate(lambda: a @ b, 2 * 1024**3) / 1e9
    if native_bf16():
        a16, b16 = a.bfloat16(), b.bfloat16()
        measured["bf16_matmul_gflops"] = rate(lambda: a16 @ b16, 2 * 1024**3) / 1e9
    source, target = torch.ones(copy_mb * 1024**2 // 4), torch.empty(copy_mb * 1024**2 // 4)
    measured["bandwidth_gbs"] = rate(lambda: target.copy_(source), 2 * source.numel() * 4) / 1e9
    path = calibration_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, measured)
    return measured


def device_dict(device: Device) -> dict[str, Any]:
    return asdict(device)
