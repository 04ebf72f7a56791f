"""The generation-backend contract and token sampling.

A backend turns token-id contexts into one model action each. It knows nothing of
environments or tools: the rollout engine owns the episode loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ponder.models.logprobs import logprobs_from_logits
from ponder.rollout.constrain import Constraint


@dataclass
class GenerationRequest:
    """One action to generate: the full context so far and its limits.

    key identifies the episode (scripted backends look up their canned turns by it).
    constraint: a `ponder.rollout.constrain.Constraint` the action must match (its
    tokens are sampled from the grammar-masked distribution), or None.
    """

    key: str
    context_ids: list[int]
    max_new_tokens: int
    constraint: Constraint | None = None


@dataclass
class Generation:
    """What the policy produced for one request.

    finish_reason: `stop` (a stop string appeared), `eos` (end-of-turn token),
    `length` (max_new_tokens reached), `abort` (the `hf` backend's `on_token` ended it).
    logprobs[i] is log p(token_ids[i]) under the sampling distribution.
    policy_logprobs: for a constrained request (hf backend), log p(token_ids[i]) under the
    policy's own distribution, before the grammar's mask; None otherwise.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    policy_logprobs: list[float] | None = None


class GenerationBackend(Protocol):
    tokenizer: Any

    def generate(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]: ...


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from logits [B, V]; returns (tokens [B], logprobs [B]).

    Logprobs come from softmax(logits / temperature) over the full vocabulary, the
    distribution the trainer recomputes; top-p only restricts which tokens can be
    drawn. temperature == 0 is greedy, with logprobs of the untempered distribution.
    """
    logits = logits.float()
    if temperature <= 0:
        tokens = logits.argmax(-1)
        return tokens, logprobs_from_logits(logits, tokens)
    scaled = logits if temperature == 1.0 else logits / temperature  # a copy of the logits saved
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        draw = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    else:
        draw = probs
    tokens = draw_from(draw, generator)
    # log of the softmax already computed (a drawn token's probability is never 0);
    # a second log-sum-exp over the vocabulary cost ~5 ms per step at batch 128
    return tokens, probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).log()


def draw_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of probs [B, V] (rows need not be normalised), by inverting
    the cumulative distribution at a uniform draw: the same law as torch.multinomial
    at about a fourteenth of its cost on a 49k vocabulary on the 2-core CPU
    (bench/sampling.py). Zero-probability entries are never drawn."""
    cumulative = probs.cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=cumulative.dtype, device=probs.device)
    u = u * cumulative[:, -1:]
    index = torch.searchsorted(cumulative, u, right=True)
    overflow = index >= probs.shape[-1]
    # u rounded up to the total (vanishingly rare): the likeliest entry, never a zero one.
    # On a GPU without asking first (a host sync every step); on the CPU only when needed.
    if probs.device.type != "cpu" or bool(overflow.any()):
        index = torch.where(overflow, probs.argmax(-1, keepdim=True), index)
    return index.squeeze(-1)


def first_stop(text: str, stop_strings: list[str]) -> int:
    """Index just past the earliest stop string in text, or -1 when none occurs."""
    ends = [text.find(s) + len(s) for s in stop_strings if s and s in text]
    return min(ends) if ends else -1
