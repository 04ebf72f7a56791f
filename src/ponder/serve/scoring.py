"""Prompt log-probabilities (`/v1/completions` with vLLM's `prompt_logprobs: K`): the
served model's log-probability of every prompt token given the ones before it, with
the K most likely tokens at each position, in vLLM's response layout, so a teacher
served by `ponder serve` or by vLLM scores a student's tokens alike
(ponder.train.teacher's URL teacher reads either).

    "prompt_logprobs": [null, {"<token id>": {"logprob": -1.2, "rank": 3,
                                              "decoded_token": " the"}, ...}, ...]

The first position has no context and is null, as in vLLM. The model runs under the
batcher's lock (the hf backend's one model), with the request's adapter active.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from ponder.models.adapters import is_lora
from ponder.models.logprobs import position_ids_from_mask
from ponder.serve.adapters import adapter_active
from ponder.serve.errors import bad_request

MAX_TOP = 20  # vLLM's default cap on top logprobs per position


@torch.no_grad()
def prompt_logprobs(server: Any, ids: list[int], adapter: str | None, top: int) -> list[dict[str, Any] | None]:
    """vLLM's prompt_logprobs for `ids` on `server` (a ModelServer on the hf backend)."""
    if not 0 <= top <= MAX_TOP:
        raise bad_request(f"prompt_logprobs must be between 0 and {MAX_TOP}, got {top}", param="prompt_logprobs")
    batcher = server.generator
    if not hasattr(batcher, "lock") or not hasattr(batcher.backend, "policy"):
        raise bad_request("prompt_logprobs needs ponder serve's own backend (--backend hf); a vLLM server "
                          "answers them itself", param="prompt_logprobs")  # fmt: skip
    with batcher.lock:
        model = batcher.backend.policy.model
        input_ids = torch.tensor([ids], device=batcher.backend.policy.device)
        mask = torch.ones_like(input_ids)
        with adapter_active(model, adapter) if is_lora(model) else nullcontext():
            logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                           use_cache=False).logits[0, :-1].float()  # fmt: skip
    logprobs = torch.log_softmax(logits, dim=-1)
    return [None, *[_position(logprobs[t], ids[t + 1], top, server) for t in range(len(ids) - 1)]]


def _position(row: torch.Tensor, token: int, top: int, server: Any) -> dict[str, Any]:
    """One position: the prompt's own token and the `top` most likely, each with its
    logprob, rank (1 = most likely) and text."""
    chosen = {token, *row.topk(top).indices.tolist()} if top else {token}
    out = {}
    for candidate in sorted(chosen, key=lambda t: -row[t].item()):
        logprob = row[candidate].item()
        rank = int((row > row[candidate]).sum().item()) + 1
        out[str(candidate)] = {"logprob": logprob, "rank": rank, "decoded_token": server.decode([candidate])}
    return out
