"""Continuous batching for the `hf` backend's eager decode loop: requests join the
running batch at the next decode step and leave it the step they finish.

`HFBackend.generate` takes a batch and returns when its last row ends, so a request
arriving meanwhile waits for the whole batch. `generate_continuous` asks `admit(room)`
after every step for requests to join: they are prefilled on their own and their keys
and values joined to the running cache (`SlabCache.join`: one copy of the cache, made
with the copy that drops finished rows, so a join costs what a compaction costs); a
row that finishes is handed to `done` at once, not at the end of the batch. The loop
returns when no row is live and nothing joins. Every row is sampled with the
backend's one sampling setting (a server admits only requests that share it).

Only the eager loop joins rows; the GPU's static-shape steps (rollout.graph_decode)
would recompile for every batch shape, so there `HFBackend.continuous()` is False and
callers batch as before.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from ponder.models.cpu_threads import cpu_block
from ponder.rollout.backend import Generation, GenerationRequest
from ponder.rollout.kv import join_masks

Admit = Callable[[int], list[GenerationRequest]]
Done = Callable[[GenerationRequest, Generation], None]


def generate_continuous(backend: Any, first: list[GenerationRequest], admit: Admit, done: Done,
                        max_batch: int, stop_strings: list[str] | None = None) -> int:  # fmt: skip
    """Decode `first` and every request `admit` gives (see module docstring); each
    finished request goes to `done(request, generation)` on this thread. Returns how
    many requests were decoded."""
    with cpu_block() if backend.policy.device.type == "cpu" else nullcontext():
        return _decode(backend, first, admit, done, max_batch, list(stop_strings or []))


@torch.no_grad()
def _decode(backend: Any, first: list[GenerationRequest], admit: Admit, done: Done, max_batch: int,
            stop_strings: list[str]) -> int:  # fmt: skip
    model = backend.sampling_model()
    state = _Batch(backend, model, first)
    decoded = len(first)
    while True:
        finished = state.sample(stop_strings)
        for row in finished:
            done(row.request, backend._to_generation(row))
        joining = admit(max_batch - len(state.live)) if len(state.live) < max_batch else []
        if not state.live and not joining:
            return decoded
        decoded += len(joining)
        state.step(joining)


class _Batch:
    """The running batch: rows (in cache order), which are live, the cache, the last
    logits and the attention mask and next positions the next forward reads."""

    def __init__(self, backend: Any, model: Any, requests: list[GenerationRequest]) -> None:
        self.backend, self.model = backend, model
        self.rows = backend._rows(requests)
        self.cache, self.logits, self.mask, self.position = backend._prefill(model, requests)
        self.live = list(range(len(self.rows)))
        self.tokens: torch.Tensor | None = None

    def sample(self, stop_strings: list[str]) -> list[Any]:
        """A token for every live row; returns the rows that finished with it."""
        backend, batch = self.backend, list(range(len(self.rows)))
        unmasked = backend._unmasked(self.rows, batch, self.live, self.logits)
        tokens, logprobs, self.tokens = backend._sample(backend._constrain(self.logits, self.rows, batch, self.live))
        backend._book_unmasked(self.rows, batch, unmasked, self.tokens)
        still = backend._book(self.rows, batch, self.live, tokens, logprobs, stop_strings, self.cache, self.mask)
        finished = [self.rows[j] for j in self.live if j not in set(still)]
        self.live = still
        return finished

    def step(self, joining: list[GenerationRequest]) -> None:
        """The next forward for the live rows, then `joining`'s prefill joined to them
        (the join's copy of the cache also drops the finished rows)."""
        from ponder.rollout.hf import _compact

        if self.live:
            if not joining and _compact(self.live, list(range(len(self.rows)))):
                self._keep()
            self._forward()
        if joining:
            self._join(joining)

    def _keep(self) -> None:
        """Drop the finished rows, from the cache too."""
        index = torch.tensor(self.live, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask, self.position, self.tokens = self.mask[index], self.position[index], self.tokens[index]
        self.rows, self.live = [self.rows[j] for j in self.live], list(range(len(self.live)))

    def _forward(self) -> None:
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        out = self.model(input_ids=self.tokens.unsqueeze(-1), attention_mask=self.mask, position_ids=self.position,
                         past_key_values=self.cache, use_cache=True)  # fmt: skip
        self.logits, self.position = out.logits[:, -1], self.position + 1

    def _join(self, requests: list[GenerationRequest]) -> None:
        rows = self.backend._rows(requests)
        cache, logits, mask, position = self.backend._prefill(self.model, requests)
        if not self.live:  # nothing running: the newcomers are the batch
            self.rows, self.cache, self.logits, self.mask, self.position = rows, cache, logits, mask, position
        else:
            index = torch.tensor(self.live, device=mask.device)
            self.cache.join(index, cache)
            self.mask = join_masks(self.mask[index], mask)
            self.logits = torch.cat([self.logits[index], logits])
            self.position = torch.cat([self.position[index], position])
            self.rows = [self.rows[j] for j in self.live] + rows
        self.live = list(range(len(self.rows)))
