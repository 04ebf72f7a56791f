"""Requests that arrive together are generated together.

One worker thread owns the backend. It takes the oldest waiting job, gathers every
job that arrives within `window_s` (or is already waiting) and can share its batch,
up to `max_batch`, and generates them together. Jobs share a batch when they use the
same adapter and the same sampling settings (the backend samples a batch with one
temperature and top-p). The batch is continuous where the backend decodes eagerly
(ponder.rollout.continuous): a job that arrives while it runs joins it at the next
decode step, and each job's result is set the step its row ends; jobs of another
adapter or sampling wait, and while one waits nothing more joins, so the batch drains
and theirs is next. Elsewhere (the GPU's static-shape steps, a scripted backend) a
batch runs to its end and what arrives meanwhile forms the next one.

Per job, through the backend's `on_token` hook: its own stop strings end its row
(so jobs with different `stop` share a batch), streaming jobs get the text so far
after every token, and a cancelled job (its client left) ends its row at once.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ponder.rollout.backend import Generation, GenerationRequest, first_stop
from ponder.rollout.constrain import Constraint
from ponder.serve.adapters import AdapterBackend

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """One completion to generate.

    on_text: for streaming, called on the worker thread with the decoded text so far
        after every token (stop strings not yet cut).
    cancelled: set by the server when the client has gone; its row ends at the next token.
    constraint: what the completion is sampled to match (ponder.rollout.constrain), or None.
    """

    context_ids: list[int]
    max_new_tokens: int
    adapter: str | None
    temperature: float
    top_p: float
    stop: list[str] = field(default_factory=list)
    on_text: Callable[[str], None] | None = None
    constraint: Constraint | None = None
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    future: Future = field(default_factory=Future)
    cancelled: bool = False
    stopped: bool = False

    def batch_key(self) -> tuple[str | None, float, float]:
        # Greedy ignores top_p: every greedy job of an adapter can share a batch.
        return (self.adapter, 0.0, 1.0) if self.temperature <= 0 else (self.adapter, self.temperature, self.top_p)


@dataclass
class JobResult:
    """finish_reason: `stop` (end of turn or a stop string), `length`, or `abort`.
    adapter: the PEFT adapter that generated it (the job's name resolved; None: the base).
    logprobs[i]: log p(token_ids[i]) under the distribution sampled; policy_logprobs: under
    the policy's own distribution, before a constraint's mask (constrained jobs, hf backend)."""

    token_ids: list[int]
    text: str
    finish_reason: str
    stopped: bool
    adapter: str | None = None
    logprobs: list[float] = field(default_factory=list)
    policy_logprobs: list[float] | None = None


class Batcher:
    """The worker thread and its queue (see module docstring). `start()`, `submit(job)`,
    `stop()`; `batch_sizes` lists the size of every batch run and `cancelled` counts jobs
    dropped or ended early because their client left, for tests and logs. `lock` is held
    while a batch generates: whoever changes the model's adapters takes it first."""

    def __init__(self, backend: AdapterBackend, window_s: float = 0.005, max_batch: int = 32) -> None:
        self.backend = backend
        self.window_s = window_s
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []
        self.cancelled = 0
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._waiting: deque[Job] = deque()
        self._running: dict[str, Job] = {}
        self._stopping = False
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ponder-serve-batcher", daemon=True)
        backend.on_token = self._observe

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the batch in progress and end the thread; jobs still waiting are cancelled."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def submit(self, job: Job) -> Future:
        if not self._thread.is_alive():
            raise RuntimeError("the generation worker is not running")
        self._queue.put(job)
        return job.future

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            if batch:
                self._generate(batch)
        for job in list(self._waiting):
            job.future.cancel()

    def _next_batch(self) -> list[Job] | None:
        """The oldest job and those that can join it; None when told to stop."""
        first = self._waiting.popleft() if self._waiting else self._queue.get()
        if first is None:
            return None
        batch, key, later = [first], first.batch_key(), deque()
        for job in self._waiting:
            (batch if job.batch_key() == key and len(batch) < self.max_batch else later).append(job)
        self._waiting = later
        deadline = time.monotonic() + self.window_s
        while len(batch) < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # stop after this batch
                break
            (batch if job.batch_key() == key else self._waiting).append(job)
        for job in batch:
            if job.cancelled:
                job.future.cancel()
                self.cancelled += 1
        return [job for job in batch if job.future.set_running_or_notify_cancel()]

    def _generate(self, batch: list[Job]) -> None:
        first = batch[0]
        with self.lock:
            adapter = self.backend.resolve(first.adapter)
            self.backend.adapter = adapter
            self.backend.sampling = dataclasses.replace(self.backend.sampling, temperature=first.temperature,
                                                        top_p=first.top_p)  # fmt: skip
            self._running = {job.key: job for job in batch}
            decoded = len(batch)
            try:
                if self._continuous():
                    decoded = self.backend.generate_continuous([_request(job) for job in batch],
                                                               self._admitter(first.batch_key()),
                                                               self._finisher(adapter), self.max_batch)  # fmt: skip
                else:
                    generations = self.backend.generate([_request(job) for job in batch], [])
                    for job, generation in zip(batch, generations):
                        self._finisher(adapter)(_request(job), generation)
            except Exception as exc:  # one bad batch must not end the worker: its requests get the error
                logger.exception("generation failed")
                for job in self._running.values():
                    job.future.set_exception(exc)
                return
            finally:
                self._running = {}
        self.batch_sizes.append(decoded)

    def _continuous(self) -> bool:
        continuous = getattr(self.backend, "continuous", None)
        return continuous is not None and continuous()

    def _admitter(self, key: tuple[str | None, float, float]) -> Callable[[int], list[GenerationRequest]]:
        """Continuous batching's `admit`: up to `room` waiting jobs of the running batch's
        adapter and sampling, oldest first; none once a job of another one waits (the
        batch then drains, and that job's batch is next) or the worker is told to stop."""

        def admit(room: int) -> list[GenerationRequest]:
            self._take_queued()
            if self._stopping or any(job.batch_key() != key for job in self._waiting):
                return []
            taken: list[Job] = []
            while self._waiting and len(taken) < room:
                job = self._waiting.popleft()
                if job.cancelled:
                    job.future.cancel()
                    self.cancelled += 1
                elif job.future.set_running_or_notify_cancel():
                    taken.append(job)
            self._running.update({job.key: job for job in taken})
            return [_request(job) for job in taken]

        return admit

    def _take_queued(self) -> None:
        """Move every job already queued into `_waiting`, without waiting for more."""
        while not self._stopping:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is None:
                self._stopping = True
                self._queue.put(None)  # the worker stops once this batch has drained
            else:
                self._waiting.append(job)

    def _finisher(self, adapter: str | None) -> Callable[[GenerationRequest, Generation], None]:
        """A row's end: its job's future gets the result at once."""

        def finish(request: GenerationRequest, generation: Generation) -> None:
            job = self._running.pop(request.key)
            job.future.set_result(dataclasses.replace(self._result(job, generation), adapter=adapter))

        return finish

    def _observe(self, request: GenerationRequest, token_ids: list[int]) -> bool:
        """The backend's per-token hook (see module docstring); True ends the row."""
        job = self._running.get(request.key)
        return job is not None and observe_tokens(job, token_ids, self.backend.tokenizer)

    def _result(self, job: Job, generation: Generation) -> JobResult:
        result = job_result(job, generation)
        self.cancelled += result.finish_reason == "abort"
        return result

    def health(self) -> str | None:
        """None while the worker runs, else why not (for GET /health)."""
        return None if self._thread.is_alive() else "the generation worker has stopped"


def _request(job: Job) -> GenerationRequest:
    return GenerationRequest(job.key, job.context_ids, job.max_new_tokens, job.constraint)


def observe_tokens(job: Job, token_ids: list[int], tokenizer: Any) -> bool:
    """After each token of `job` (any backend): True ends it, because its client left or
    one of its stop strings appeared; streaming jobs get the text so far."""
    if job.cancelled:
        return True
    if not job.stop and job.on_text is None:
        return False
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    if job.stop and first_stop(text, job.stop) >= 0:
        job.stopped = True
    if job.on_text is not None:
        job.on_text(text)
    return job.stopped


def job_result(job: Job, generation: Generation) -> JobResult:
    """A generation in the server's terms: finish `stop` (end of turn or a stop string),
    `length`, or `abort` (its client left)."""
    if job.stopped or generation.finish_reason in ("eos", "stop"):
        reason = "stop"
    else:
        reason = "abort" if generation.finish_reason == "abort" else "length"
    return JobResult(generation.token_ids, generation.text, reason, job.stopped, logprobs=generation.logprobs,
                     policy_logprobs=generation.policy_logprobs)  # fmt: skip
