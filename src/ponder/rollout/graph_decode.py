"""Decode steps of static shape, replayed from a CUDA graph on a GPU.

Why: on an H100 a batch-1 decode step of a 1.5B model through transformers' eager
forward launched 1 202 kernels taking 3.6 ms of GPU time inside 39-62 ms of wall
time (docs/benchmarks.md, "On a GPU"): the GPU waited on Python and on launches. A
CUDA graph replays a captured step's kernels with one launch, but needs every
shape and every address fixed. So a `GraphStep`:

- keeps the batch's keys and values in fixed buffers [B, kv_heads, S, head_dim]
  (the `SlabCache` the eager prefill filled, S its capacity), writes each new token
  at a slot held in a device tensor, and attends over all S slots with a mask of the
  real ones (slots not yet written are masked out);
- runs the lean decoder's layers (`rollout.llama_decode`: fused q|k|v and gate|up,
  LoRA merged) on those buffers, the query heads of each KV head attending as one
  group (one new token per row, so grouped-query attention needs no copied keys);
- is captured once per batch of rows and replayed every step. Finished rows stay in
  the batch (their samples are ignored) until half of it has finished; then the
  live rows move to a smaller step of their own (`select`), so a batch whose rows
  end at different lengths costs at most twice the rows it needs.

Off CUDA the same step runs eagerly, which is how the CPU tests check it against
the lean decoder (tests/rollout/test_graph_decode.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ponder.rollout.kv import SlabCache
from ponder.rollout.llama_decode import LlamaDecoder


class GraphStep:
    """One decode step for a fixed batch: `step(tokens [B])` reads the tokens at the
    rows' next positions, writes their keys and values at the next slot and returns
    the logits [B, V] of the token after (a buffer the next call overwrites)."""

    def __init__(self, decoder: LlamaDecoder, kv: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor,
                 positions: torch.Tensor, slot: int) -> None:  # fmt: skip
        self.decoder, self.kv = decoder, kv
        self.valid = valid  # [B, S] bool: slots holding a token the row has read
        self.positions = positions  # [B] the next token's position
        self.slot = slot  # the next slot to write (the same for every row)
        self._slot = torch.tensor([slot], device=valid.device)
        self.tokens = torch.zeros(valid.shape[0], dtype=torch.long, device=valid.device)
        self.graph: Any = None
        self.logits = self._capture() if valid.device.type == "cuda" else None

    @classmethod
    def after_prefill(cls, decoder: LlamaDecoder, cache: SlabCache, attention_mask: torch.Tensor,
                      next_position: torch.Tensor) -> GraphStep:  # fmt: skip
        """The step that follows the backend's prefill: the cache's buffers, its
        attention mask [B, n] over the n slots written and next positions [B, 1]."""
        kv = cache.buffers()
        rows, written = attention_mask.shape
        valid = torch.zeros(rows, kv[0][0].shape[2], dtype=torch.bool, device=attention_mask.device)
        valid[:, :written] = attention_mask.bool()
        return cls(decoder, kv, valid, next_position[:, 0].clone(), written)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.slot >= self.valid.shape[1]:
            raise RuntimeError(f"GraphStep: the cache's {self.valid.shape[1]} slots are full")
        self.tokens.copy_(tokens)
        self.valid[:, self.slot] = True
        self._slot.fill_(self.slot)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.logits = self._forward()
        self.slot += 1
        self.positions += 1
        return self.logits

    def attention_mask(self) -> torch.Tensor:
        """[B, n] over the slots written so far (1 = a token the row has read)."""
        return self.valid[:, : self.slot]

    def row(self, index: int, slots: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `index`'s keys and values at the given slots, every layer (copies)."""
        return [(k[index, :, slots].clone(), v[index, :, slots].clone()) for k, v in self.kv]

    def select(self, index: list[int]) -> GraphStep:
        """A step for the given rows only (copies of their caches), captured anew."""
        at = torch.tensor(index, device=self.valid.device)
        kv = [(k[at], v[at]) for k, v in self.kv]
        return GraphStep(self.decoder, kv, self.valid[at], self.positions[at], self.slot)

    def _forward(self) -> torch.Tensor:
        decoder = self.decoder
        rows = self.tokens.shape[0]
        groups = decoder.heads // decoder.kv_heads
        hidden = decoder.embed[self.tokens].unsqueeze(1)  # [B, 1, H]
        cos, sin = decoder.rotary(self.positions.unsqueeze(1))
        # [B, 1, 1, S] additive, built once a step rather than converted in every layer
        mask = torch.zeros_like(self.valid, dtype=hidden.dtype).masked_fill_(~self.valid, float("-inf"))[:, None, None]

        for layer, (keys, values) in zip(decoder.layers, self.kv, strict=True):

            def attend(q, k, v, keys=keys, values=values):
                keys.index_copy_(2, self._slot, k)
                values.index_copy_(2, self._slot, v)
                grouped = q.reshape(rows, decoder.kv_heads, groups, decoder.head_dim)  # heads → query rows
                out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask)
                return out.reshape(rows, decoder.heads, 1, decoder.head_dim)

            hidden = decoder.block(layer, hidden, cos, sin, attend)
        return decoder.logits(hidden)[:, 0]

    def _capture(self) -> torch.Tensor:
        """Warm up on a side stream (kernels chosen, workspaces allocated), then record
        one step; the warm-up writes the current slot, which every replay overwrites."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            logits = self._forward()
        return logits
