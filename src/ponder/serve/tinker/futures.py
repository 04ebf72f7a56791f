"""The Tinker API's futures: every request that computes returns `{"request_id"}` at
once, and the client polls `/api/v1/retrieve_future` for the result.

One worker thread runs the jobs in the order they were submitted. The client sends
a training client's requests one after another (each waits for the previous one's
acknowledgement), so a forward_backward, the optim_step after it and the save after
that run in that order; one thread also keeps two torch jobs from contending for the
cores. Sampling jobs of the same sampler and parameters that are queued together run
as one batch.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

# Finished results kept for retrieval (the client fetches each once; retries may ask again).
KEEP_RESULTS = 4096
# How long a batchable job waits for more of its kind to queue behind it.
BATCH_WINDOW_S = 0.02


@dataclass
class Result:
    """A finished job: a JSON body, a protobuf body, or an error with its category
    (`user`: bad input, `server`: a failure here), as retrieve_future answers it."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


@dataclass
class Job:
    """Work for the worker. `run()` returns the Result. Jobs with the same `batch_key`
    (not None) queued back to back run together through `run_batch(jobs)`, which
    returns one Result per job."""

    run: Callable[[], Result]
    batch_key: Hashable | None = None
    run_batch: Callable[[list[Job]], list[Result]] | None = None
    payload: Any = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


class Worker:
    """Runs submitted jobs in order on one thread; `future(request_id)` finds a job's."""

    def __init__(self) -> None:
        self._queue: deque[Job] = deque()
        self._ready = threading.Condition()
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="ponder-tinker-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> str:
        future: Future = Future()
        with self._ready:
            self._futures[job.request_id] = future
            while len(self._futures) > KEEP_RESULTS:
                oldest, kept = next(iter(self._futures.items()))
                if not kept.done():
                    break
                del self._futures[oldest]
            self._queue.append(job)
            self._ready.notify()
        return job.request_id

    def future(self, request_id: str) -> Future | None:
        with self._ready:
            return self._futures.get(request_id)

    def stop(self) -> None:
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            jobs = self._next_jobs()
            if jobs is None:
                return
            for job, result in zip(jobs, self._run(jobs)):
                self.future(job.request_id).set_result(result)

    def _next_jobs(self) -> list[Job] | None:
        with self._ready:
            while not self._queue and not self._stopping:
                self._ready.wait()
            if self._stopping:
                return None
            first = self._queue.popleft()
        if first.batch_key is None:
            return [first]
        time.sleep(BATCH_WINDOW_S)  # the rest of a burst of sample requests joins this batch
        jobs = [first]
        with self._ready:
            while self._queue and self._queue[0].batch_key == first.batch_key:
                jobs.append(self._queue.popleft())
        return jobs

    @staticmethod
    def _run(jobs: list[Job]) -> list[Result]:
        try:
            if len(jobs) == 1:
                return [jobs[0].run()]
            return jobs[0].run_batch(jobs)
        except (ValueError, LookupError) as err:
            return [Result(error=_one_line(err), category="user")] * len(jobs)
        except Exception as err:  # a failure here must fail the request, never the worker
            return [Result(error=f"{type(err).__name__}: {_one_line(err)}", category="server")] * len(jobs)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
