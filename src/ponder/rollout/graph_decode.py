"""Decode steps of static shape, replayed from a CUDA graph on a GPU.

Why: on an H100 a batch-1 decode step of a 1.5B model through transformers' eager
forward launched 1 202 kernels taking 3.6 ms of GPU time inside 39-62 ms of wall
time (docs/results/benchmarks.md, "On a GPU"): the GPU waited on Python and on launches. A
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

A step is three pure functions of tensors (`StepFunctions`: the embedding, rotary
angles and mask; one layer, called for each; the final norm and vocabulary head),
each layer's residual added at the start of the next so that the add and its
RMSNorm are one fused kernel once compiled. With `compiled` they go through
torch.compile (inductor: Triton kernels on a GPU) before being captured, which
fuses the ~17 small kernels of a layer (norms, rotary, the cache writes, SiLU·up)
into four; the matrix products and attention stay cuBLAS's and SDPA's. On an H200
that made batch-1 decode 1.3x faster (docs/results/benchmarks.md, "On a GPU").
One compilation per process serves every layer and model of the same shape (a new
batch or cache size recompiles once, then its dimension is dynamic).

If compilation fails (no Triton for this GPU, no C++ compiler on a CPU) the step
warns once and runs uncompiled for the rest of the process.

Off CUDA the same step runs eagerly (or compiled by inductor's C++ backend), which
is how the CPU tests check it against the lean decoder
(tests/rollout/test_graph_decode.py).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ponder.rollout.kv import SlabCache
from ponder.rollout.llama_decode import LlamaDecoder, rotary, rotate


class StepFunctions(NamedTuple):
    prologue: Any  # (tokens, positions, valid, embed, inv_freq) -> hidden, delta, cos, sin, mask
    layer: Any  # (hidden, delta, weights, keys, values, slot, mask, cos, sin) -> hidden, delta
    epilogue: Any  # (hidden, delta, norm, head, head_bias) -> logits [B, V]


def step_functions(heads: int, kv_heads: int, head_dim: int, eps: float, compiled: bool) -> StepFunctions:
    """The step's functions for a model shape, compiled once per process if asked
    (and compilation has not failed in this process)."""
    return _step_functions(heads, kv_heads, head_dim, eps, compiled and not _COMPILE_FAILED)


_COMPILE_FAILED: list[str] = []  # the first failure's message, once compilation has failed


@functools.lru_cache(maxsize=None)
def _step_functions(heads: int, kv_heads: int, head_dim: int, eps: float, compiled: bool) -> StepFunctions:
    groups = heads // kv_heads

    def prologue(tokens, positions, valid, embed, inv_freq):
        hidden = embed[tokens].unsqueeze(1)  # [B, 1, H]
        cos, sin = rotary(positions.unsqueeze(1), inv_freq, embed.dtype)
        # [B, 1, 1, S] additive, built once a step rather than in every layer
        mask = torch.zeros_like(valid, dtype=hidden.dtype).masked_fill(~valid, float("-inf"))[:, None, None]
        return hidden, torch.zeros_like(hidden), cos, sin, mask

    def layer(hidden, delta, weights, keys, values, slot, mask, cos, sin):
        input_norm, qkv, qkv_bias, o, o_bias, post_norm, gate_up, down = weights
        hidden = hidden + delta  # the previous layer's MLP output
        rows = hidden.shape[0]
        split = _linear(F.rms_norm(hidden, hidden.shape[-1:], input_norm, eps), qkv, qkv_bias)
        split = split.view(rows, 1, heads + 2 * kv_heads, head_dim).transpose(1, 2)
        q, k = rotate(split[:, : heads + kv_heads], cos, sin).split([heads, kv_heads], dim=1)
        keys.index_copy_(2, slot, k)
        values.index_copy_(2, slot, split[:, heads + kv_heads :])
        # one new token per row: each KV head's query heads attend as rows of one group
        grouped = q.reshape(rows, kv_heads, groups, head_dim)
        attended = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask)
        hidden = hidden + _linear(attended.reshape(rows, 1, heads * head_dim), o, o_bias)
        normed = F.rms_norm(hidden, hidden.shape[-1:], post_norm, eps)
        gate, up = _linear(normed, gate_up, None).chunk(2, dim=-1)
        return hidden, _linear(F.silu(gate) * up, down, None)

    def epilogue(hidden, delta, norm, head, head_bias):
        hidden = hidden + delta
        return _linear(F.rms_norm(hidden, hidden.shape[-1:], norm, eps), head, head_bias)[:, 0]

    functions = StepFunctions(prologue, layer, epilogue)
    if compiled:
        functions = StepFunctions(*(torch.compile(f, fullgraph=True) for f in functions))
    return functions


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weightᵀ + bias in the weight's dtype, returned in x's."""
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


class GraphStep:
    """One decode step for a fixed batch: `step(tokens [B])` reads the tokens at the
    rows' next positions, writes their keys and values at the next slot and returns
    the logits [B, V] of the token after (a buffer the next call overwrites). The
    decoder's matrices must be plain (`lean_decoder(..., pack=False)`)."""

    def __init__(self, decoder: LlamaDecoder, kv: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor,
                 positions: torch.Tensor, slot: int, compiled: bool = False) -> None:  # fmt: skip
        if decoder.pack:
            raise ValueError("GraphStep: the decoder's matrices are packed: use lean_decoder(..., pack=False)")
        self.decoder, self.kv, self.compiled = decoder, kv, compiled
        self.functions = self._functions()
        self.weights = [
            (x.input_norm, x.qkv.weight, x.qkv.bias, x.o.weight, x.o.bias, x.post_norm, x.gate_up.weight,
             x.down.weight)
            for x in decoder.layers
        ]
        self.valid = valid  # [B, S] bool: slots holding a token the row has read
        self.positions = positions  # [B] the next token's position
        self.slot = slot  # the next slot to write (the same for every row)
        self._slot = torch.tensor([slot], device=valid.device)
        self.tokens = torch.zeros(valid.shape[0], dtype=torch.long, device=valid.device)
        self.graph: Any = None
        self.logits = self._capture() if valid.device.type == "cuda" else None

    @classmethod
    def after_prefill(cls, decoder: LlamaDecoder, cache: SlabCache, attention_mask: torch.Tensor,
                      next_position: torch.Tensor, compiled: bool = False) -> GraphStep:  # fmt: skip
        """The step that follows the backend's prefill: the cache's buffers, its
        attention mask [B, n] over the n slots written and next positions [B, 1]."""
        kv = cache.buffers()
        rows, written = attention_mask.shape
        valid = torch.zeros(rows, kv[0][0].shape[2], dtype=torch.bool, device=attention_mask.device)
        valid[:, :written] = attention_mask.bool()
        return cls(decoder, kv, valid, next_position[:, 0].clone(), written, compiled)

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
        return GraphStep(self.decoder, kv, self.valid[at], self.positions[at], self.slot, self.compiled)

    def _forward(self) -> torch.Tensor:
        try:
            return self._step()
        except torch._dynamo.exc.BackendCompilerFailed as error:
            if not self.compiled:
                raise
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            _COMPILE_FAILED.append(first)
            warnings.warn(f"rollout: torch.compile failed ({first}); decoding uncompiled from now on "
                          "(rollout.sampling.decoder: static skips compiling)", stacklevel=2)  # fmt: skip
            self.compiled = False
            self.functions = self._functions()
            return self._step()

    def _functions(self) -> StepFunctions:
        d = self.decoder
        return step_functions(d.heads, d.kv_heads, d.head_dim, d.eps, self.compiled)

    def _step(self) -> torch.Tensor:
        decoder, functions = self.decoder, self.functions
        hidden, delta, cos, sin, mask = functions.prologue(
            self.tokens, self.positions, self.valid, decoder.embed, decoder.inv_freq
        )
        for weights, (keys, values) in zip(self.weights, self.kv, strict=True):
            hidden, delta = functions.layer(hidden, delta, weights, keys, values, self._slot, mask, cos, sin)
        return functions.epilogue(hidden, delta, decoder.final_norm, decoder.head.weight, decoder.head.bias)

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
