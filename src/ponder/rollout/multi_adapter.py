"""The `hf` backend sampling many LoRA adapters in one batch (multi-adapter training).

Each request names its adapter in its key, `ADAPTER/…` (the multi-adapter trainer
gives every task the id `ADAPTER/TASK_ID`, so an episode's key is `ADAPTER/TASK_ID#k`).
One decode step runs every row of the batch through the PEFT model once: the frozen
products for all rows together, each row's adapter delta per group of rows sharing an
adapter (models/multi_lora.py). The KV cache is kept per episode between turns as in
the `hf` backend; shared prefills (a system prompt all new episodes have) are shared
only among the rows of one adapter, since an adapter changes the keys and values.

The lean CPU decoder merges one adapter into fused matrices, so this backend samples
from the unmerged PEFT model instead: per row that is slower than the decoder a single
adapter's run uses, and the whole batch's frozen products are shared.
"""

from __future__ import annotations

from typing import Any

import torch

from ponder.config import SamplingConfig
from ponder.models.loading import Policy
from ponder.models.multi_lora import adapter_names, rows_with_adapters
from ponder.rollout.backend import Generation, GenerationRequest
from ponder.rollout.hf import HFBackend, _compact
from ponder.rollout.kv import RowKV


def adapter_of_key(key: str, known: list[str]) -> str:
    """The adapter a request's key names (`ADAPTER/…`); a one-line ValueError when it names none of `known`."""
    name, sep, _ = key.partition("/")
    if not sep or name not in known:
        raise ValueError(f"adapter {name if sep else key!r} does not exist; this model has {', '.join(known)}")
    return name


class MultiAdapterBackend(HFBackend):
    """Batched sampling where each row uses the adapter its request's key names."""

    def __init__(self, policy: Policy, sampling: SamplingConfig, seed: int = 0, reuse_kv: bool = True) -> None:
        model = getattr(policy.model, "peft_model", policy.model)
        if not adapter_names(model):
            raise ValueError("MultiAdapterBackend needs a model with LoRA adapters (attach_lora_adapters)")
        super().__init__(policy, sampling, seed=seed, reuse_kv=reuse_kv)
        self.model = model
        # the PEFT model itself samples, in the trainer's dtype: its log-probs are the trainer's
        self.dtype = policy.dtype
        self.logprobs_match_trainer = True
        self._reading: str | None = None  # the adapter whose rows _pasts is prefilling

    def adapters(self) -> list[str]:
        return adapter_names(self.model)

    def sampling_model(self) -> Any:
        return self.model

    def continuous(self) -> bool:
        return False

    def snapshot(self) -> None:
        raise ValueError("train.async_rollouts is not supported with several adapters: the update moves the "
                         "weights the next rollouts would sample from")  # fmt: skip

    @torch.no_grad()
    def _generate(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        """The `hf` backend's eager decode loop, each batch row under its own adapter."""
        known = self.adapters()
        names: list[str | None] = [adapter_of_key(r.key, known) for r in requests]
        model, device = self.model, self.policy.device
        rows = self._rows(requests)
        with rows_with_adapters(names, device):
            cache, logits, attention_mask, next_position = self._prefill(model, requests)
        batch = list(range(len(rows)))  # rows[batch[j]] is batch row j
        live = list(range(len(rows)))
        while True:
            unmasked = self._unmasked(rows, batch, live, logits)
            token_list, logprob_list, tokens = self._sample(self._constrain(logits, rows, batch, live))
            self._book_unmasked(rows, batch, unmasked, tokens)
            live = self._book(rows, batch, live, token_list, logprob_list, stop_strings, cache, attention_mask)
            if not live:
                break
            if _compact(live, batch):
                index = torch.tensor(live, device=attention_mask.device)
                cache.batch_select_indices(index)
                attention_mask, next_position, tokens = attention_mask[index], next_position[index], tokens[index]
                batch, live = [batch[j] for j in live], list(range(len(live)))
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(batch), 1)], dim=1)
            with rows_with_adapters([names[i] for i in batch], device):
                out = model(input_ids=tokens.unsqueeze(-1), attention_mask=attention_mask,
                            position_ids=next_position, past_key_values=cache, use_cache=True)  # fmt: skip
            logits, next_position = out.logits[:, -1], next_position + 1
        return [self._to_generation(row) for row in rows]

    def _pasts(self, model: Any, requests: list[GenerationRequest]) -> list[RowKV | None]:
        """The `hf` backend's cached pasts, shared prefills computed per adapter."""
        known = self.adapters()
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(adapter_of_key(request.key, known), []).append(i)
        pasts: list[RowKV | None] = [None] * len(requests)
        for name, members in groups.items():
            self._reading = name
            found = super()._pasts(model, [requests[i] for i in members])
            for i, past in zip(members, found):
                pasts[i] = past
        return pasts

    def _read(self, model: Any, prefixes: list[list[int]]) -> list[RowKV]:
        """A shared prefill of prefixes, all of the adapter `_pasts` is reading for."""
        with rows_with_adapters([self._reading] * len(prefixes), self.policy.device):
            return super()._read(model, prefixes)
