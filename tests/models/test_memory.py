"""glibc's heap settings (ponder.models.memory), each in a fresh interpreter: the
mmap threshold is process-wide."""

import os
import subprocess
import sys

import pytest

# A training pass's pattern: large blocks (activations) allocated between small ones
# that outlive them, after an earlier large free (the previous pass) raised glibc's
# own threshold. Prints the threshold set and the MB the large blocks' free returned.
SCRIPT = """
import torch
from ponder.models.memory import map_large_blocks

def rss_mb():
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) / 1e3

threshold = map_large_blocks()
torch.ones(1_000_000).sum()  # 4 MB freed: glibc alone now serves smaller blocks from its heap
large, small = [], []
for _ in range(64):
    large.append(torch.ones(600_000))  # 2.4 MB each, touched
    small.append(torch.ones(50_000))  # 200 KB: from the heap, between the large ones
before = rss_mb()
del large
print(threshold, round(before - rss_mb()))
"""


def _run(**env: str) -> tuple[int, float]:
    environment = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "PONDER_MMAP_THRESHOLD")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**environment, **env}, capture_output=True,
                         text=True, check=True)  # fmt: skip
    threshold, freed = out.stdout.split()
    return int(threshold), float(freed)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_large_blocks_leave_the_resident_set_when_freed():
    threshold, freed = _run()
    assert threshold == 1 << 20 and freed > 120  # 64 x 2.4 MB = 154 MB back to the system
    threshold, kept = _run(PONDER_MMAP_THRESHOLD="0")  # glibc's own threshold: the heap keeps them
    assert threshold == 0 and kept < 40
    assert _run(MALLOC_MMAP_THRESHOLD_="4194304")[0] == 0  # the user's setting wins
    assert _run(PONDER_MMAP_THRESHOLD="2097152")[0] == 2097152


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status: Linux only")
def test_peak_rss_is_the_kernels_high_water_mark():
    from ponder.models.memory import peak_rss_gb

    with open("/proc/self/status") as status:
        high_water = int(status.read().split("VmHWM:")[1].split()[0]) * 1024 / 1e9
    assert peak_rss_gb() == pytest.approx(high_water, rel=0.05)


def test_a_threshold_that_is_not_a_byte_count_is_a_clear_error(monkeypatch):
    from ponder.models.memory import map_large_blocks

    monkeypatch.setenv("PONDER_MMAP_THRESHOLD", "1M")
    with pytest.raises(ValueError, match=r"PONDER_MMAP_THRESHOLD='1M': give a number of bytes"):
        map_large_blocks()
