"""KV-cache pieces for the `hf` backend's decode loop.

`SlabCache` preallocates each layer's keys and values for the whole call and
writes new tokens in place: transformers' DynamicCache concatenates the whole
cache on every decode step, which on the CPU cost about half of each step.

`KVStore` keeps, per episode, the keys and values of every token the model has
already read, so the next turn of a multi-turn episode only prefills the new
tokens (the observation) instead of the whole conversation again.

Rows of a batch carry their own past lengths: a row's cache is right-aligned at
`past_width` with padding on the left, and the attention mask marks real slots.
Keys are stored after rotary embedding with the token's true position, so a slot
index never has to equal a position.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

# One cached row: for every layer, (keys, values) of shape [kv_heads, tokens, head_dim].
RowKV = list[tuple[torch.Tensor, torch.Tensor]]


class _SlabLayer(DynamicLayer):
    """A DynamicLayer whose storage is a [B, H, capacity, D] buffer, allocated at the
    first update (when heads and head size are known) with the rows' pasts copied in."""

    def __init__(self, capacity: int, pasts: list[tuple[torch.Tensor, torch.Tensor] | None], width: int) -> None:
        super().__init__()
        self._capacity, self._pasts, self._n = capacity, pasts, width

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rows, heads, _, head_dim = key_states.shape
        self._k = key_states.new_zeros(rows, heads, self._capacity, head_dim)
        self._v = value_states.new_zeros(rows, value_states.shape[1], self._capacity, value_states.shape[-1])
        for i, past in enumerate(self._pasts):
            if past is not None and past[0].shape[1] > 0:
                self._k[i, :, self._n - past[0].shape[1] : self._n] = past[0]
                self._v[i, :, self._n - past[1].shape[1] : self._n] = past[1]
        self._pasts = []
        self.is_initialized = True

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._n + key_states.shape[-2]
        if end > self._k.shape[-2]:
            self._k, self._v = _grow(self._k, end), _grow(self._v, end)
        self._k[:, :, self._n : end] = key_states
        self._v[:, :, self._n : end] = value_states
        self._n = end
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._views()

    def get_seq_length(self) -> int:
        return self._n

    def join(self, keep: torch.Tensor, other: _SlabLayer) -> None:
        """Rows `keep` of this layer, then every row of `other`, both right-aligned at
        the wider of the two pasts (continuous batching: rows joining a running batch)."""
        n, m = self._n, other._n
        width, room = max(n, m), max(self._k.shape[2] - n, other._k.shape[2] - m)
        for name in ("_k", "_v"):
            mine, theirs = getattr(self, name)[keep], getattr(other, name)
            joined = mine.new_zeros(len(mine) + len(theirs), mine.shape[1], width + room, mine.shape[-1])
            joined[: len(mine), :, width - n : width] = mine[:, :, :n]
            joined[len(mine) :, :, width - m : width] = theirs[:, :, :m]
            setattr(self, name, joined)
        self._n = width
        self._views()

    def row(self, index: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row `index`'s keys and values at the given slots (a copy)."""
        return self._k[index, :, slots].clone(), self._v[index, :, slots].clone()


def _grow(buffer: torch.Tensor, needed: int) -> torch.Tensor:
    extra = max(needed - buffer.shape[2], 64)
    return torch.cat([buffer, buffer.new_zeros(*buffer.shape[:2], extra, buffer.shape[-1])], dim=2)


class SlabCache(Cache):
    """A cache for len(pasts) rows with room for `capacity` slots per row (it grows if
    needed); row i starts from pasts[i] (or nothing), right-aligned at `past_width`."""

    def __init__(self, n_layers: int, capacity: int, pasts: list[RowKV | None], past_width: int) -> None:
        layers = [
            _SlabLayer(capacity, [None if p is None else p[layer] for p in pasts], past_width)
            for layer in range(n_layers)
        ]
        super().__init__(layers=layers)

    def row(self, index: int, slots: torch.Tensor) -> RowKV:
        return [layer.row(index, slots) for layer in self.layers]

    def join(self, keep: torch.Tensor, other: SlabCache) -> None:
        """Keep rows `keep` and append `other`'s rows after them, every layer (see
        _SlabLayer.join); attention masks are joined alike by `join_masks`."""
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.join(keep, theirs)

    def buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's whole (keys, values) storage [B, H, capacity, D], after the first
        update: what a static-shape decode step (rollout.graph_decode) writes into."""
        return [(layer._k, layer._v) for layer in self.layers]


@dataclass
class _Entry:
    tokens: list[int]
    kv: RowKV


class KVStore:
    """Per-episode caches between calls. An entry is used once, by the next request
    with the same key whose context extends the entry's tokens. Without a `capacity`
    (rollouts), entries of keys not requested in a call are dropped (that episode
    ended); with one (the gateway's sessions, whose calls arrive one by one and join a
    running batch), they stay, the least recently stored dropped beyond `capacity`."""

    def __init__(self, capacity: int | None = None) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: str, tokens: list[int], kv: RowKV) -> None:
        self._entries[key] = _Entry(tokens, kv)
        self._entries.move_to_end(key)
        while self.capacity is not None and len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def take_all(self, keys: list[str], contexts: list[list[int]]) -> list[RowKV | None]:
        """For each request, its cached past (or None); what the requests' keys held is
        gone afterwards (and, without a capacity, everything else too)."""
        pasts: list[RowKV | None] = []
        for key, context in zip(keys, contexts):
            entry = self._entries.pop(key, None)
            usable = entry is not None and len(entry.tokens) < len(context)
            pasts.append(entry.kv if usable and context[: len(entry.tokens)] == entry.tokens else None)
        if self.capacity is None:
            self._entries.clear()
        return pasts

    def clear(self) -> None:
        self._entries.clear()


def join_masks(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """Two attention masks [B, n] and [B', m] as one [B + B', max(n, m)], each
    left-padded with zeros: the slot layout of SlabCache.join."""
    width = max(mine.shape[1], theirs.shape[1])
    pad = [torch.nn.functional.pad(mask, (width - mask.shape[1], 0)) for mask in (mine, theirs)]
    return torch.cat(pad, dim=0)


def past_length(past: RowKV | None) -> int:
    return 0 if past is None else past[0][0].shape[1]
