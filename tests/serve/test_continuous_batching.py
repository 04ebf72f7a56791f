"""The serving batcher batches continuously on the hf backend: a job that arrives while
a batch runs joins it at the next decode step and gets its result when its own row
ends, not when the batch does; a job of another adapter waits for the batch to drain."""

from __future__ import annotations

import time

import pytest

from ponder.models.tiny import tiny_policy
from ponder.serve.adapters import AdapterBackend
from ponder.serve.batcher import Batcher, Job


@pytest.fixture()
def batcher():
    worker = Batcher(AdapterBackend(tiny_policy(seed=0)), window_s=0.0, max_batch=8)
    worker.start()
    yield worker
    worker.stop()


def _job(batcher, text: str, budget: int, **kw) -> Job:
    return Job(batcher.backend.tokenizer.encode(text), budget, kw.pop("adapter", None), kw.pop("temperature", 0.0),
               1.0, **kw)  # fmt: skip


def test_a_job_joins_the_running_batch_and_leaves_before_it_ends(batcher):
    tokens = []
    started = _job(batcher, "a long answer", 400, on_text=lambda text: tokens.append(time.monotonic()))
    long = batcher.submit(started)
    while len(tokens) < 3:  # the long job is decoding
        time.sleep(0.005)
    short = batcher.submit(_job(batcher, "short", 4))
    result = short.result(timeout=60)
    assert not long.done()  # came back while the long job still runs
    assert len(result.token_ids) == 4 and result.finish_reason == "length"
    assert len(long.result(timeout=120).token_ids) == 400
    _wait_for(lambda: batcher.batch_sizes)  # booked once the batch has drained
    assert batcher.batch_sizes == [2]  # one continuous batch decoded both

    again = batcher.submit(_job(batcher, "short", 4)).result(timeout=60)
    assert again.token_ids == result.token_ids  # joining mid-batch changed nothing (greedy)


def test_a_job_with_other_sampling_waits_for_the_batch_to_drain(batcher):
    tokens = []
    long = batcher.submit(_job(batcher, "a long answer", 200, on_text=lambda text: tokens.append(1)))
    while len(tokens) < 3:
        time.sleep(0.005)
    other = batcher.submit(_job(batcher, "sampled", 4, temperature=1.0))
    same = batcher.submit(_job(batcher, "greedy too", 4))  # queued after a job of other sampling: waits too
    assert len(other.result(timeout=120).token_ids) == 4 and long.done()
    same.result(timeout=60)
    _wait_for(lambda: len(batcher.batch_sizes) == 2)
    assert batcher.batch_sizes[0] == 1  # nothing joined the long job while the other one waited


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
