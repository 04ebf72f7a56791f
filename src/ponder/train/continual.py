"""Continual learning's stateful parts: a reservoir buffer (rehearsal mixed into new
batches, A-GEM's and DER++'s episodic memory), the per-weight importances and anchors
of EWC (diagonal Fisher), MAS (output sensitivity) and SI (path integral, accumulated
during training), and DER++'s stored logits. The math is ponder.algos.continual;
the methods that combine these pieces are ponder.train.continual_methods.

The quadratic states are step hooks of the SFT loop (train/sft.py): `after_backward`
runs after the batch's NLL gradient is in `.grad` and adds the method's own terms,
`after_step` after the optimizer moved the weights.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

from ponder.algos.continual import (
    ewc_penalty,
    output_sensitivity,
    quadratic_penalty,
    si_importance,
    si_path_step,
)
from ponder.data.format import TokenizedExample
from ponder.models.forward import forward_policy
from ponder.train.batch import TokenBatch, collate

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

    def add(self, item: T) -> bool:
        """Offer `item`; True when the buffer kept it."""
        self.seen += 1
        if len(self.items) < self.capacity:
            self.items.append(item)
            return True
        slot = self.rng.randrange(self.seen)
        if slot < self.capacity:
            self.items[slot] = item
            return True
        return False

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


class StepHook(Protocol):
    """What the SFT loop calls around each optimizer step (train/sft.py)."""

    def after_backward(self, policy: Any, params: list[torch.nn.Parameter]) -> dict[str, float]:
        """The batch's NLL gradient is in `.grad`: add the method's terms; return metrics."""
        ...

    def after_step(self, policy: Any, params: list[torch.nn.Parameter]) -> None:
        """The optimizer has moved the weights."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue as if uninterrupted (checkpointed with the trainer)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def trainable(policy: Any) -> dict[str, torch.nn.Parameter]:
    """The parameters training changes, by name."""
    return {n: p for n, p in policy.model.named_parameters() if p.requires_grad}


def one_example(policy: Any, example: TokenizedExample) -> TokenBatch:
    """A batch of one tokenised example on the policy's device."""
    return collate([example.to_trajectory()], policy.tokenizer.pad_token_id).to(policy.device)


def per_example_gradients(
    policy: Any,
    examples: list[TokenizedExample],
    objective: Callable[[Any, TokenBatch], torch.Tensor],
    reduce: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """mean over examples of reduce(∂ objective(example) / ∂θ) for every trainable weight,
    in eval mode (no dropout: the importance of the model as it is); `.grad` is left empty."""
    named = trainable(policy)
    totals = {n: torch.zeros_like(p) for n, p in named.items()}
    was_training = policy.model.training
    policy.model.eval()
    for example in examples:
        policy.model.zero_grad(set_to_none=True)
        objective(policy, one_example(policy, example)).backward()
        for name, param in named.items():
            if param.grad is not None:
                totals[name] += reduce(param.grad.detach()) / len(examples)
    policy.model.zero_grad(set_to_none=True)
    policy.model.train(was_training)
    return totals


def assistant_logits(policy: Any, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward pass: (per-token log-probs [B, L-1], the logits at the kept positions
    [B, K, V] with their graph, the loss mask at those positions [B, K])."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    logprobs, _, _ = forward_policy(
        policy.model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask, kept_logits=kept
    )
    keep, logits = kept[0]
    return logprobs, logits, batch.loss_mask[:, keep]


def _log_likelihood(policy: Any, batch: TokenBatch) -> torch.Tensor:
    mask = batch.loss_mask
    logprobs, _, _ = forward_policy(policy.model, batch.input_ids, batch.attention_mask, loss_mask=mask)
    return (logprobs * mask).sum()


def _output_norm(policy: Any, batch: TokenBatch) -> torch.Tensor:
    _, logits, mask = assistant_logits(policy, batch)
    return output_sensitivity(logits, mask).sum()


def diagonal_fisher(policy: Any, examples: list[TokenizedExample]) -> dict[str, torch.Tensor]:
    """Empirical diagonal Fisher of the trainable parameters: the mean over examples of
    the squared gradient of each example's summed assistant-token log-likelihood."""
    if not examples:
        raise ValueError("EWC needs at least one example of the previous task to estimate the Fisher")
    return per_example_gradients(policy, examples, _log_likelihood, lambda grad: grad**2)


def mas_importance(policy: Any, examples: list[TokenizedExample]) -> dict[str, torch.Tensor]:
    """MAS's importance (Aljundi et al. 2018): the mean over examples of |∂F(x)/∂θ|, with
    F(x) the squared L2 norm of the model's logit vector averaged over the example's
    assistant positions (ponder.algos.continual.output_sensitivity). Unsupervised:
    the demonstrated tokens only say where to look, not what to predict."""
    if not examples:
        raise ValueError("MAS needs at least one example of the previous task to estimate the importance")
    return per_example_gradients(policy, examples, _output_norm, torch.abs)


def _accumulate(totals: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> None:
    for name, value in new.items():
        totals[name] = totals.get(name, torch.zeros_like(value)) + value


def _anchor(policy: Any, names: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if n in names}


def _backward(term: torch.Tensor) -> float:
    if term.requires_grad:
        term.backward()
    return float(term.detach())


@dataclass
class EWCState:
    """θ* and F of the tasks learnt so far (Fishers summed over tasks, anchors the latest).
    A step hook: (λ/2)·Σ F (θ − θ*)² is added to every step's loss."""

    weight: float
    anchors: dict[str, torch.Tensor] = field(default_factory=dict)
    fisher: dict[str, torch.Tensor] = field(default_factory=dict)

    def consolidate(self, policy: Any, examples: list[TokenizedExample]) -> None:
        """Call after a task: add its Fisher and anchor the current weights."""
        new = diagonal_fisher(policy, examples)
        _accumulate(self.fisher, new)
        self.anchors = _anchor(policy, new)

    def penalty(self, policy: Any) -> torch.Tensor:
        if not self.anchors or self.weight == 0:
            return torch.zeros((), device=policy.device)
        params = {n: p for n, p in policy.model.named_parameters() if n in self.anchors}
        return ewc_penalty(params, self.anchors, self.fisher, self.weight)

    def after_backward(self, policy: Any, params: list[torch.nn.Parameter]) -> dict[str, float]:
        return {"sft/ewc_penalty": _backward(self.penalty(policy))}

    def after_step(self, policy: Any, params: list[torch.nn.Parameter]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"weight": self.weight, "anchors": self.anchors, "fisher": self.fisher}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight, self.anchors, self.fisher = state["weight"], state["anchors"], state["fisher"]


@dataclass
class MASState:
    """MAS: θ* and Ω = mean |∂F/∂θ| of the tasks learnt so far (summed over tasks, as
    EWC's Fishers are; anchors the latest). A step hook adding λ·Σ Ω (θ − θ*)²."""

    weight: float
    anchors: dict[str, torch.Tensor] = field(default_factory=dict)
    importance: dict[str, torch.Tensor] = field(default_factory=dict)

    def consolidate(self, policy: Any, examples: list[TokenizedExample]) -> None:
        """Call after a task: add its importance and anchor the current weights."""
        new = mas_importance(policy, examples)
        _accumulate(self.importance, new)
        self.anchors = _anchor(policy, new)

    def penalty(self, policy: Any) -> torch.Tensor:
        if not self.anchors:
            return torch.zeros((), device=policy.device)
        params = {n: p for n, p in policy.model.named_parameters() if n in self.anchors}
        return quadratic_penalty(params, self.anchors, self.importance, self.weight)

    def after_backward(self, policy: Any, params: list[torch.nn.Parameter]) -> dict[str, float]:
        return {"sft/mas_penalty": _backward(self.penalty(policy))}

    def after_step(self, policy: Any, params: list[torch.nn.Parameter]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


@dataclass
class SIState:
    """Synaptic Intelligence (Zenke et al. 2017). During a task each step adds
    −g·Δθ to ω, with g the gradient of the task's NLL alone (taken before the penalty's
    gradient is added, as in the authors' code) and Δθ the optimizer's actual update;
    at the task's end Ω += max(ω, 0) / (Δ² + ξ) with Δ the task's total move, and θ*
    becomes the current weights. A step hook adding c·Σ Ω (θ − θ*)²."""

    c: float
    xi: float
    anchors: dict[str, torch.Tensor] = field(default_factory=dict)
    importance: dict[str, torch.Tensor] = field(default_factory=dict)
    omega: dict[str, torch.Tensor] = field(default_factory=dict)
    start: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    before: dict[str, torch.Tensor] = field(default_factory=dict)

    def begin_task(self, policy: Any) -> None:
        """Call before a task: the path integral starts at 0 from the current weights."""
        named = trainable(policy)
        self.start = _anchor(policy, named)
        self.omega = {n: torch.zeros_like(p) for n, p in named.items()}

    def penalty(self, policy: Any) -> torch.Tensor:
        if not self.anchors:
            return torch.zeros((), device=policy.device)
        params = {n: p for n, p in policy.model.named_parameters() if n in self.anchors}
        return quadratic_penalty(params, self.anchors, self.importance, self.c)

    def after_backward(self, policy: Any, params: list[torch.nn.Parameter]) -> dict[str, float]:
        named = trainable(policy)
        self.grads = {
            n: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for n, p in named.items()
        }
        self.before = _anchor(policy, named)
        return {"sft/si_penalty": _backward(self.penalty(policy))}

    def after_step(self, policy: Any, params: list[torch.nn.Parameter]) -> None:
        if not self.omega:
            raise RuntimeError("SI: begin_task was not called before training")
        for name, param in trainable(policy).items():
            self.omega[name] += si_path_step(self.grads[name], self.before[name], param.detach())

    def consolidate(self, policy: Any) -> None:
        """Call after a task: add its importance, anchor the current weights."""
        named = trainable(policy)
        new = {n: si_importance(self.omega[n], p.detach() - self.start[n], self.xi) for n, p in named.items()}
        _accumulate(self.importance, new)
        self.anchors = _anchor(policy, named)
        self.omega, self.grads, self.before = {}, {}, {}

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


@dataclass
class StoredLogits:
    """A buffered example with the logits the model gave it when it was stored (DER++):
    one row per assistant position, in position order. values [A, E] (float32, CPU);
    index [A, E] the vocabulary ids of a top-E selection, or None when E is the
    whole vocabulary."""

    example: TokenizedExample
    values: torch.Tensor
    index: torch.Tensor | None = None


@torch.no_grad()
def record_logits(policy: Any, example: TokenizedExample, topk: int = 0) -> StoredLogits:
    """`example` with the current model's logits at its assistant positions (the top
    `topk` of each and their ids; 0 = all), computed in eval mode."""
    was_training = policy.model.training
    policy.model.eval()
    _, logits, mask = assistant_logits(policy, one_example(policy, example))
    policy.model.train(was_training)
    rows = logits[0][mask[0].bool()].float()
    if topk <= 0 or topk >= rows.shape[-1]:
        return StoredLogits(example, rows.cpu())
    top = rows.topk(topk, dim=-1)
    return StoredLogits(example, top.values.cpu(), top.indices.to(torch.int32).cpu())


def stored_logits_batch(
    items: list[StoredLogits], mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The items' stored logits laid out like a forward pass's kept positions: mask
    [B, K] is 1 at each row's assistant positions among the K kept (one row per item,
    collated in this order) -> (values [B, K, E], index [B, K, E] or None); 0 at
    unmasked positions."""
    width = items[0].values.shape[-1]
    values = torch.zeros(mask.shape[0], mask.shape[1], width, device=mask.device)
    index = None if items[0].index is None else torch.zeros_like(values, dtype=torch.long)
    for row, item in enumerate(items):
        where = mask[row].bool()
        if int(where.sum()) != item.values.shape[0]:
            raise ValueError("DER++: a stored example's assistant positions do not match its batch row")
        values[row, where] = item.values.to(mask.device)
        if index is not None and item.index is not None:
            index[row, where] = item.index.to(mask.device, torch.long)
    return values, index
