"""Continual learning: a reservoir rehearsal buffer mixed into new batches, and EWC
(a diagonal Fisher estimated on the previous task's data; the penalty itself is
ponder.algos.dpo.ewc_penalty)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from ponder.algos.dpo import ewc_penalty
from ponder.data.format import TokenizedExample
from ponder.models.forward import forward_policy
from ponder.train.batch import collate

T = TypeVar("T")


class ReservoirBuffer(Generic[T]):
    """Keeps a uniform sample of at most `capacity` of every item ever offered
    (Vitter's algorithm R): after n offers each item is held with probability capacity/n."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        if capacity < 0:
            raise ValueError(f"replay capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.items: list[T] = []
        self.seen = 0
        self.rng = random.Random(seed)

    def add(self, item: T) -> None:
        self.seen += 1
        if len(self.items) < self.capacity:
            self.items.append(item)
            return
        slot = self.rng.randrange(self.seen)
        if slot < self.capacity:
            self.items[slot] = item

    def extend(self, items: list[T]) -> None:
        for item in items:
            self.add(item)

    def sample(self, count: int) -> list[T]:
        """`count` items drawn with replacement (an empty list when the buffer is empty)."""
        if not self.items:
            return []
        return [self.items[self.rng.randrange(len(self.items))] for _ in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def state_dict(self) -> dict[str, Any]:
        return {"items": list(self.items), "seen": self.seen, "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.items, self.seen = list(state["items"]), state["seen"]
        self.rng.setstate(state["rng"])


def replay_count(batch_size: int, ratio: float, buffered: int) -> int:
    """How many of a batch's rows come from the buffer: round(ratio·batch), 0 when empty."""
    if buffered == 0 or ratio <= 0:
        return 0
    return min(batch_size - 1, max(1, round(ratio * batch_size)))


def diagonal_fisher(policy: Any, examples: list[TokenizedExample]) -> dict[str, torch.Tensor]:
    """Empirical diagonal Fisher of the trainable parameters: the mean over examples of
    the squared gradient of each example's summed assistant-token log-likelihood."""
    named = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    fisher = {n: torch.zeros_like(p) for n, p in named.items()}
    if not examples:
        raise ValueError("EWC needs at least one example of the previous task to estimate the Fisher")
    was_training = policy.model.training
    policy.model.eval()  # no dropout: the Fisher of the model as it is
    for example in examples:
        batch = collate([example.to_trajectory()], policy.tokenizer.pad_token_id)
        mask = batch.loss_mask.to(policy.device)
        ids, attention = batch.input_ids.to(policy.device), batch.attention_mask.to(policy.device)
        logprobs, _, _ = forward_policy(policy.model, ids, attention, loss_mask=mask)
        policy.model.zero_grad(set_to_none=True)
        (logprobs * mask).sum().backward()
        for name, param in named.items():
            if param.grad is not None:
                fisher[name] += param.grad.detach() ** 2 / len(examples)
    policy.model.zero_grad(set_to_none=True)
    policy.model.train(was_training)
    return fisher


@dataclass
class EWCState:
    """θ* and F of the tasks learnt so far (Fishers summed over tasks, anchors the latest)."""

    weight: float
    anchors: dict[str, torch.Tensor] = field(default_factory=dict)
    fisher: dict[str, torch.Tensor] = field(default_factory=dict)

    def consolidate(self, policy: Any, examples: list[TokenizedExample]) -> None:
        """Call after a task: add its Fisher and anchor the current weights."""
        new = diagonal_fisher(policy, examples)
        for name, value in new.items():
            self.fisher[name] = self.fisher.get(name, torch.zeros_like(value)) + value
        self.anchors = {n: p.detach().clone() for n, p in policy.model.named_parameters() if n in new}

    def penalty(self, policy: Any) -> torch.Tensor:
        if not self.anchors or self.weight == 0:
            return torch.zeros((), device=policy.device)
        params = {n: p for n, p in policy.model.named_parameters() if n in self.anchors}
        return ewc_penalty(params, self.anchors, self.fisher, self.weight)

    def state_dict(self) -> dict[str, Any]:
        return {"weight": self.weight, "anchors": self.anchors, "fisher": self.fisher}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight, self.anchors, self.fisher = state["weight"], state["anchors"], state["fisher"]
