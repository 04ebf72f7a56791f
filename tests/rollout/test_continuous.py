"""Continuous batching (ponder.rollout.continuous): requests that join a running batch
mid-decode, and rows that leave it, get what each would get decoded alone; finished
rows are handed back the step they finish."""

from __future__ import annotations

import pytest
import torch

from ponder.config import SamplingConfig
from ponder.models.tiny import tiny_policy
from ponder.rollout.backend import GenerationRequest
from ponder.rollout.constrain import Constraint
from ponder.rollout.continuous import generate_continuous
from ponder.rollout.hf import HFBackend
from ponder.rollout.kv import join_masks


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


def _request(policy, key: str, text: str, budget: int, constraint=None) -> GenerationRequest:
    return GenerationRequest(key, policy.tokenizer.encode(text), budget, constraint)


@pytest.mark.parametrize("decoder", ["auto", "transformers"])
def test_rows_that_join_and_leave_get_what_they_get_alone(policy, decoder):
    backend = HFBackend(policy, SamplingConfig(temperature=0.0, decoder=decoder), reuse_kv=False)
    first = [_request(policy, "a", "hello there", 6), _request(policy, "b", "a much longer prompt than that", 20)]
    long = " ".join(["a long prompt, wider than the running batch's cache"] * 6)
    later = {2: [_request(policy, "c", "x", 9)], 3: [_request(policy, "w", long, 5)], 4: [_request(policy, "d", "the fourth one", 12),
                                                     _request(policy, "e", "five", 3, Constraint.regex("[0-9]{3}"))]}
    calls, finished_at = [0], {}

    def admit(room: int) -> list[GenerationRequest]:
        calls[0] += 1
        return later.pop(calls[0], [])[:room]

    results = {}

    def done(request, generation):
        results[request.key] = generation
        finished_at[request.key] = calls[0]

    assert backend.continuous()
    assert generate_continuous(backend, first, admit, done, max_batch=8) == 6
    for request in [*first, _request(policy, "c", "x", 9), _request(policy, "w", long, 5), _request(policy, "d", "the fourth one", 12),
                    _request(policy, "e", "five", 3, Constraint.regex("[0-9]{3}"))]:  # fmt: skip
        (alone,) = backend.generate([request], [])
        assert results[request.key].token_ids == alone.token_ids, request.key
        assert torch.allclose(torch.tensor(results[request.key].logprobs), torch.tensor(alone.logprobs), atol=1e-4)
    assert results["e"].text.isdigit() and len(results["e"].text) == 3
    assert finished_at["a"] < finished_at["b"]  # "a" (6 tokens) was handed back before "b" (20) ended
    assert len(results["a"].token_ids) == 6 and len(results["b"].token_ids) == 20


def test_admission_respects_the_room_left(policy):
    backend = HFBackend(policy, SamplingConfig(temperature=0.0), reuse_kv=False)
    waiting = [_request(policy, str(i), f"prompt {i}", 4) for i in range(6)]
    rooms, seen = [], []

    def admit(room: int):
        rooms.append(room)
        taken = waiting[:room]
        del waiting[:room]
        return taken

    generate_continuous(backend, [_request(policy, "first", "go", 4)], admit, lambda r, g: seen.append(r.key), 3)
    assert sorted(seen) == sorted(["first", *map(str, range(6))])
    assert rooms[0] == 2 and max(rooms) <= 3  # never more rows than max_batch


def test_masks_join_left_padded():
    joined = join_masks(torch.tensor([[0, 1, 1]]), torch.tensor([[1], [1]]))
    assert joined.tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 1]]
