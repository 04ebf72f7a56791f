"""Tinker's sampling clients on ponder's `hf` backend (rollout/hf.py).

A sampling session samples from fixed weights: the base model, a snapshot taken by
`save_weights_and_get_sampling_client` (save_weights_for_sampler without a name), or
the sampler weights saved under a tinker path. Each is decoded by its own HFBackend,
whose sampling copy (ponder's lean decoder, the adapters merged in) is taken when the
weights are published, so training on afterwards does not move it. At most
`max_live` of those copies stay in memory (least recently used first out); one
evicted is rebuilt from the snapshot kept in memory or from its directory.

A session goes stale, and its requests get 410, when the weights it was opened on
are gone: the sampler weights at its path were saved again (the path now names new
weights), or its snapshot is one of more than `max_kept` a training client took.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ponder.config import SamplingConfig
from ponder.models.adapters import load_adapter_weights, load_trainable_state, trainable_state
from ponder.models.loading import Policy
from ponder.models.logprobs import logprobs_from_logits
from ponder.rollout.backend import GenerationRequest
from ponder.rollout.hf import HFBackend
from ponder.rollout.kv import SlabCache
from ponder.serve.tinker.futures import Job, Result
from ponder.serve.tinker.training import LoraLayout, TrainedModel, lora_copy, read_manifest
from ponder.serve.tinker.wire import SampledSequence, encode_sample_response


class Stale(LookupError):
    """The session's weights are gone (410)."""


@dataclass
class SamplerSession:
    """One sampling session: which base it samples, from which weights (`source`), and
    the tinker path it was opened on (None: the base model or a snapshot)."""

    session_id: str
    base_model: str
    source: str
    model_path: str | None = None
    stale: str | None = None


@dataclass
class Weights:
    """What a source samples from: the base (layout None), adapter weights kept in
    memory (`state`), or an adapter directory on disk."""

    base_model: str
    layout: LoraLayout | None = None
    state: dict[str, torch.Tensor] | None = None
    directory: Path | None = None


@dataclass
class SampleCall:
    """One asample request, checked: prompt ids, samples, sampling parameters."""

    session_id: str
    source: str
    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float
    top_p: float
    stop_strings: tuple[str, ...]
    stop_ids: tuple[int, ...] | None  # None: the model's end-of-turn tokens
    seed: int | None
    prompt_logprobs: bool
    logprobs_last_n: int | None
    sequence_ids: list[str]

    def batch_key(self) -> Any:
        """Requests that can share one generate call (seeded and scoring ones run alone)."""
        if self.seed is not None or self.prompt_logprobs:
            return None
        return ("sample", self.source, self.temperature, self.top_p, self.stop_strings, self.stop_ids)


class Samplers:
    """Every sampling session of a server and the decoders behind them (see module doc)."""

    def __init__(self, bases: dict[str, Policy], seed: int, max_live: int = 2, max_kept: int = 4) -> None:
        self.bases = bases
        self.seed = seed
        self.max_live = max(1, max_live)
        self.max_kept = max(1, max_kept)
        self.sessions: dict[str, SamplerSession] = {}
        self.weights: dict[str, Weights] = {f"base:{name}": Weights(name) for name in bases}
        self.versions: dict[str, int] = {}  # tinker path -> times its sampler weights were saved
        self._kept: dict[str, deque[str]] = {}  # model id -> its snapshot sources, oldest first
        self._live: OrderedDict[str, HFBackend] = OrderedDict()
        self._scaffolds: dict[tuple[str, LoraLayout], Policy] = {}
        self._generators: dict[torch.device, torch.Generator] = {}
        self._lock = threading.RLock()

    # -- sessions (the event loop's thread) -------------------------------------------

    def open(self, session_id: str, base_model: str, source: str, model_path: str | None = None) -> SamplerSession:
        with self._lock:
            session = SamplerSession(session_id, base_model, source, model_path)
            self.sessions[session_id] = session
            return session

    def open_path(self, session_id: str, path: str, directory: Path) -> SamplerSession:
        """A session on the sampler weights saved at `path` (its current version)."""
        manifest = read_manifest(directory)
        with self._lock:
            version = self.versions.setdefault(path, 1)
            source = f"path:{path}#{version}"
            self.weights.setdefault(source, Weights(manifest["base_model"], LoraLayout(**manifest["lora"]),
                                                    directory=directory))  # fmt: skip
            return self.open(session_id, manifest["base_model"], source, path)

    def session(self, session_id: str) -> SamplerSession:
        """The open session; LookupError (404) when unknown, Stale (410) when its weights are gone."""
        with self._lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise LookupError(f"unknown sampling session {session_id!r}: create a sampling client first")
            if session.stale:
                raise Stale(f"stale sampler {session_id}: {session.stale}; create a new sampling client")
            return session

    # -- publishing weights (the worker's thread) -------------------------------------

    def publish_snapshot(self, model: TrainedModel, session_id: str) -> SamplerSession:
        """A session on `model`'s weights as they are now."""
        source = f"snapshot:{uuid.uuid4().hex}"
        weights = Weights(model.base_model, model.layout, state=trainable_state(model.policy.model))
        backend = self._backend(model.policy)  # seconds: built outside the lock the HTTP handlers take
        with self._lock:
            self.weights[source] = weights
            kept = self._kept.setdefault(model.model_id, deque())
            kept.append(source)
            while len(kept) > self.max_kept:
                self._retire(kept.popleft(), f"{model.model_id} has taken {self.max_kept} newer snapshots since "
                                             f"(this server keeps the last {self.max_kept})")  # fmt: skip
            self._remember(source, backend)
            return self.open(session_id, model.base_model, source)

    def replaced(self, path: str) -> int:
        """Weights were just saved at `path`: sessions opened on what it held before go
        stale. Returns the path's new version."""
        with self._lock:
            previous = self.versions.get(path, 0)
            self.versions[path] = previous + 1
            if previous:
                self._retire(f"path:{path}#{previous}", f"{path} was saved again since")
            return previous + 1

    def publish_path(self, model: TrainedModel, path: str, directory: Path) -> None:
        """The sampler weights just saved at `path` by `model`, its sampling copy taken now."""
        backend = self._backend(model.policy)
        with self._lock:
            source = f"path:{path}#{self.replaced(path)}"
            self.weights[source] = Weights(model.base_model, model.layout, directory=directory)
            self._remember(source, backend)

    def release(self, prefix: str) -> None:
        """Let go of the sessions whose ids start with `prefix` (a finished client
        session's) and of the snapshots only they sample."""
        why = "its client session has finished"
        with self._lock:
            for model_id in [m for m in self._kept if m.startswith(prefix)]:
                for source in self._kept.pop(model_id):
                    self._retire(source, why)
            for session in self.sessions.values():
                if session.session_id.startswith(prefix):
                    session.stale = why

    def _retire(self, source: str, why: str) -> None:
        self.weights.pop(source, None)
        self._live.pop(source, None)
        for session in self.sessions.values():
            if session.source == source:
                session.stale = why

    def _remember(self, source: str, backend: HFBackend) -> None:
        self._live[source] = backend
        self._live.move_to_end(source)
        while len(self._live) > self.max_live:
            self._live.popitem(last=False)

    def _backend(self, policy: Policy) -> HFBackend:
        """An HFBackend over `policy` with its sampling copy taken now."""
        backend = HFBackend(policy, SamplingConfig(temperature=1.0, top_p=1.0))
        # One random stream for the server: a new sampler (one per RL step) must not
        # replay the last one's draws.
        generator = self._generators.get(policy.device)
        if generator is None:
            generator = self._generators[policy.device] = torch.Generator(device=policy.device).manual_seed(self.seed)
        backend.generator = generator
        backend.sampling_model()
        return backend

    def live(self, source: str) -> HFBackend:
        """The decoder of `source`, rebuilt when it was evicted (only the worker builds,
        so no two threads build one source)."""
        with self._lock:
            if source in self._live:
                self._live.move_to_end(source)
                return self._live[source]
            weights = self.weights.get(source)
        if weights is None:
            raise Stale(f"the weights of {source} are gone; create a new sampling client")
        backend = self._backend(self._policy_holding(weights))
        with self._lock:
            self._remember(source, backend)
        return backend

    def _policy_holding(self, weights: Weights) -> Policy:
        base = self.bases[weights.base_model]
        if weights.layout is None:
            return base
        key = (weights.base_model, weights.layout)
        if key not in self._scaffolds:  # one LoRA copy per layout, loaded with each source in turn
            self._scaffolds[key] = lora_copy(base, weights.layout, seed=0)
        scaffold = self._scaffolds[key]
        if weights.state is not None:
            load_trainable_state(scaffold.model, weights.state)
        else:
            load_adapter_weights(scaffold.model, weights.directory)
        return scaffold

    # -- sampling (the worker's thread) -----------------------------------------------

    def job(self, call: SampleCall) -> Job:
        key = call.batch_key()
        return Job(run=lambda: self.run([call])[0], batch_key=key,
                   run_batch=lambda jobs: self.run([j.payload for j in jobs]), payload=call)  # fmt: skip

    def run(self, calls: list[SampleCall]) -> list[Result]:
        """Generate every call's samples in one batch (they share source and parameters)."""
        for call in calls:
            self.session(call.session_id)  # stale since it was queued: refused
        first = calls[0]
        backend = self.live(first.source)
        end_of_turn, shared = set(backend.eos_ids), backend.generator
        backend.sampling = replace(backend.sampling, temperature=first.temperature, top_p=first.top_p)
        backend.eos_ids = set(first.stop_ids) if first.stop_ids is not None else end_of_turn
        if first.seed is not None:  # a seeded request draws from its own stream, not the server's
            backend.generator = torch.Generator(device=shared.device).manual_seed(first.seed)
        requests = [GenerationRequest(uuid.uuid4().hex, list(call.prompt), call.max_tokens)
                    for call in calls for _ in range(call.num_samples)]  # fmt: skip
        try:
            generations = iter(backend.generate(requests, list(first.stop_strings)))
        finally:
            backend.eos_ids, backend.generator = end_of_turn, shared
            if backend.store is not None:
                backend.store.clear()
        results = []
        for call in calls:
            sequences = [_sequence(next(generations)) for _ in range(call.num_samples)]
            scored = prompt_logprobs(backend, call.prompt, call.logprobs_last_n) if call.prompt_logprobs else None
            results.append(Result(proto=encode_sample_response(sequences, scored)))
        return results


def _sequence(generation: Any) -> SampledSequence:
    reason = "length" if generation.finish_reason == "length" else "stop"
    return SampledSequence(list(generation.token_ids), list(generation.logprobs), reason)


@torch.no_grad()
def prompt_logprobs(backend: HFBackend, prompt: list[int], last_n: int | None) -> list[float]:
    """log p(prompt[i] | prompt[:i]) under the sampler's weights; NaN at position 0 and,
    with `last_n`, before the last `last_n` positions (the client reads NaN as None)."""
    model = backend.sampling_model()
    device = backend.policy.device
    ids = torch.tensor([prompt], device=device)
    mask = torch.ones_like(ids)
    cache = SlabCache(model.config.num_hidden_layers, len(prompt), [None], 0)
    positions = torch.arange(len(prompt), device=device).unsqueeze(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                use_cache=True, logits_to_keep=0)  # fmt: skip
    scored = logprobs_from_logits(out.logits[:, :-1].float(), ids[:, 1:])[0].tolist()
    values = [float("nan"), *scored]
    if last_n is not None:
        values = [float("nan")] * (len(values) - last_n) + values[len(values) - last_n :]
    return values
