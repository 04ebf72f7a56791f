"""The `hf` backend sampling many LoRA adapters in one batch (multi-adapter training).

Each request names its adapter in its key, `ADAPTER/…` (the multi-adapter trainer
gives every task the id `ADAPTER/TASK_ID`, so an episode's key is `ADAPTER/TASK_ID#k`).
One decode step runs every row of the batch through the PEFT model once: the frozen
products for all rows together, each row's adapter delta per group of rows sharing an
adapter (models/multi_lora.py). The KV cache is kept per episode between turns as in
the `hf` backend; shared prefills (a system prompt all new episodes have) are shared
only among the rows of one adapter, since an adapter changes the keys and values.

It samples through `MultiLoraDecoder`: ponder's lean decoder (rollout/llama_decode.py)
holding the frozen base's fused matrices, each adding the rows' low-rank deltas per
adapter (q|k|v and gate|up as one A and a block-diagonal B each). Models the lean
decoder does not cover sample through the PEFT model, the same deltas per row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ponder.config import SamplingConfig
from ponder.models.loading import Policy
from ponder.models.multi_lora import LowRank, adapter_names, current_plan, rows_with_adapters
from ponder.rollout.backend import Generation, GenerationRequest
from ponder.rollout.hf import HFBackend, _compact
from ponder.rollout.kv import RowKV
from ponder.rollout.llama_decode import LlamaDecoder, _covered, _Linear


class _RowDeltas:
    """A lean decoder's fused frozen product plus, per row, its adapter's low-rank delta:
    every adapter's A stacked (one product for all rows), each row's columns of the
    other adapters zeroed, every adapter's B side by side (one product again); both
    products as the decoder runs its own (`make`: its matrix precision and packing)."""

    def __init__(self, base: _Linear, low_rank: dict[str, LowRank], make: Callable[..., _Linear]) -> None:
        self.base = base
        self.layout = tuple((name, a.shape[0]) for name, (a, _, _) in low_rank.items())
        if low_rank:
            self.a = make(torch.cat([a for a, _, _ in low_rank.values()]), None)
            self.b = make(torch.cat([b * scaling for _, b, scaling in low_rank.values()], dim=1).contiguous(), None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        plan = current_plan()
        if plan is None:
            raise ValueError("a multi-adapter decoder runs inside rows_with_adapters (which row has which adapter)")
        out = self.base(x)
        if not self.layout:
            return out
        mask = plan_mask(plan, self.layout, x.device)
        low = self.a(x)
        low = low.mul_(mask.view(mask.shape[0], *([1] * (low.dim() - 2)), mask.shape[1]).to(low.dtype))
        return out.add_(self.b(low))


def plan_mask(plan: Any, layout: tuple[tuple[str, int], ...], device: torch.device) -> torch.Tensor:
    """[rows, sum of ranks]: 1 in the columns of each row's own adapter (`layout`: the
    adapters' names and ranks in the stacked order), kept on the plan for its next layer."""
    mask = plan.masks.get(layout)
    if mask is None:
        mask = torch.zeros(plan.rows, sum(rank for _, rank in layout), device=device)
        start = 0
        for name, rank in layout:
            for owner, rows in plan.groups:
                if owner == name:
                    mask[rows, start : start + rank] = 1.0
            start += rank
        plan.masks[layout] = mask
    return mask


def _fused_low_rank(modules: list[Any], names: list[str]) -> dict[str, LowRank]:
    """Per adapter, the low-rank factors of the fused product of `modules` (PEFT LoRA
    linears whose outputs are concatenated): A stacked, B block-diagonal, scalings in B."""
    out = {}
    for name in names:
        if not all(name in m.lora_A for m in modules):
            continue  # lora.last_n_layers: this adapter has no weights in this layer
        a = torch.cat([m.lora_A[name].weight.detach() for m in modules])
        b = torch.block_diag(*[m.lora_B[name].weight.detach() * float(m.scaling[name]) for m in modules])
        out[name] = (a, b, 1.0)
    return out


class MultiLoraDecoder(LlamaDecoder):
    """The lean decoder over the frozen base; each row's adapter added per row group."""

    def __init__(self, model: Any, matmul_dtype: torch.dtype | None = None) -> None:
        base = model.get_base_model()
        with torch.no_grad(), model.disable_adapter():  # the base weights, no adapter merged
            super().__init__(base, base.config, matmul_dtype)
        names = adapter_names(model)
        with torch.no_grad():
            for layer, block in zip(self.layers, base.model.layers, strict=True):
                attn, mlp = block.self_attn, block.mlp
                for field, modules in (("qkv", [attn.q_proj, attn.k_proj, attn.v_proj]), ("o", [attn.o_proj]),
                                       ("gate_up", [mlp.gate_proj, mlp.up_proj]), ("down", [mlp.down_proj])):  # fmt: skip
                    deltas = _RowDeltas(getattr(layer, field), _fused_low_rank(modules, names), self._linear)
                    setattr(layer, field, deltas)

    @staticmethod
    def covers(model: Any) -> bool:
        base = model.get_base_model()
        return _covered(base.config) and base.device.type == "cpu"


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
        if not MultiLoraDecoder.covers(model):  # the PEFT model samples, its log-probs the trainer's
            self.dtype, self.logprobs_match_trainer = policy.dtype, True
        self._reading: str | None = None  # the adapter whose rows _pasts is prefilling

    def adapters(self) -> list[str]:
        return adapter_names(self.model)

    def sampling_model(self) -> Any:
        """The lean multi-adapter decoder (rebuilt after each update), else the PEFT model."""
        if self._sampler is None:
            covered = MultiLoraDecoder.covers(self.model)
            self._sampler = MultiLoraDecoder(self.model, self.dtype) if covered else self.model
        return self._sampler

    def continuous(self) -> bool:
        return False

    def snapshot(self) -> None:
        raise ValueError("train.async_rollouts is not supported with several adapters: the update moves the "
                         "weights the next rollouts would sample from")  # fmt: skip

    def _generate(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        """Each adapter's rows side by side (contiguous: its delta reads a view of the
        batch), the generations back in the requests' order."""
        known = self.adapters()
        order = sorted(range(len(requests)), key=lambda i: known.index(adapter_of_key(requests[i].key, known)))
        generated = self._decode([requests[i] for i in order], stop_strings)
        out: list[Generation | None] = [None] * len(requests)
        for i, generation in zip(order, generated):
            out[i] = generation
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _decode(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        """The `hf` backend's eager decode loop, each batch row under its own adapter."""
        known = self.adapters()
        names: list[str | None] = [adapter_of_key(r.key, known) for r in requests]
        model, device = self.sampling_model(), self.policy.device
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
