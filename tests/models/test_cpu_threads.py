"""The decode thread count under CPU contention (ponder.models.cpu_threads)."""

import pytest
import torch

from ponder.models.cpu_threads import decode_threads, threads_for, torch_threads


@pytest.mark.parametrize(
    ("load", "own", "cores", "expected"),
    [
        (2.0, 2, 2, 2),  # only this process's two threads: keep both
        (0.3, 2, 2, 2),  # idle machine (this process just started)
        (3.0, 2, 2, 1),  # one other busy process: one core left
        (7.0, 2, 2, 1),  # heavily loaded: never below one thread
        (4.0, 4, 8, 4),  # a big machine with room to spare
        (10.0, 4, 8, 2),  # six cores taken by others: two left
        (2.6, 2, 2, 1),  # 0.6 of a core taken rounds to one left
    ],
)
def test_threads_follow_the_other_processes_load(load, own, cores, expected):
    assert threads_for(load, own, cores) == expected


def test_forced_count_and_bad_values(monkeypatch):
    monkeypatch.setenv("PONDER_DECODE_THREADS", "3")
    assert decode_threads() == 3
    monkeypatch.setenv("PONDER_DECODE_THREADS", "zero")
    with pytest.raises(ValueError, match="PONDER_DECODE_THREADS='zero'"):
        decode_threads()
    monkeypatch.setenv("PONDER_DECODE_THREADS", "auto")
    assert 1 <= decode_threads() <= torch.get_num_threads()


def test_torch_threads_restores_the_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
