"""The `hf` backend: a lean batched decode loop over a transformers causal LM.

Why not `model.generate`: we need per-row stop strings, the sampling-time logprob of
every token, and to drop finished rows from the batch (and its KV cache) as soon as
they stop, so later decode steps only pay for rows still generating.

Where the time went on the 2-core CPU, and what this module does about it:
- Each turn of a multi-turn episode used to prefill the whole conversation again.
  Now the keys and values of every token already read are kept per episode between
  calls (`KVStore`) and only the new tokens are prefilled. New episodes share one
  prefill of the prefix they all have in common (the system prompt), or, when that
  reads fewer tokens, the G samples of a task share one prefill of their prompt.
- DynamicCache concatenates the whole cache on every decode step; `SlabCache`
  writes into a preallocated buffer.
- Two thirds of a decode step were matrix products with 1–32 rows. Llama-family
  models on the CPU decode through `rollout.llama_decode` (fused matrices in oneDNN's
  blocked layout, ~1.4x faster per step at batch 8); other models through a merged
  copy of the transformers model.
- On a GPU the same eager loop was launch-bound (1 200 kernels a token on an H100,
  the GPU idle 90 % of the time): Llama-family models decode there through
  `rollout.graph_decode` (static-shape steps compiled by torch.compile and
  replayed from CUDA graphs).
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ponder.config import SamplingConfig
from ponder.models import cpu_matmul
from ponder.models.adapters import is_lora
from ponder.models.cpu_threads import cpu_block
from ponder.models.loading import Policy
from ponder.models.memory import trim_heap
from ponder.rollout.backend import Generation, GenerationRequest, first_stop, sample_tokens
from ponder.rollout.constrain import Matcher, grammars_for, mask_logits, opened
from ponder.rollout.graph_decode import GraphStep
from ponder.rollout.kv import KVStore, RowKV, SlabCache, past_length
from ponder.rollout.llama_decode import LlamaDecoder, lean_decoder

# Stop strings are checked on the decoded tail of each row; this many tokens cover
# any tag-like stop string while keeping the per-step decode cheap.
_STOP_WINDOW_TOKENS = 16
DECODERS = ("auto", "transformers", "static", "compiled")


@dataclass
class _Row:
    request: GenerationRequest
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = ""
    matcher: Matcher | None = None  # the request's constraint, where it has one (and it is on)
    waiting: bool = False  # the constraint has a trigger the row has not written yet
    # log p(token) under the policy's own, unmasked distribution (rows with a constraint)
    policy_logprobs: list[float] = field(default_factory=list)


class HFBackend:
    """Batched sampling with a KV cache; see module docstring."""

    def __init__(self, policy: Policy, sampling: SamplingConfig, seed: int = 0, reuse_kv: bool = True) -> None:
        if sampling.decoder not in DECODERS:
            raise ValueError(f"rollout.sampling.decoder: unknown '{sampling.decoder}'; valid: {', '.join(DECODERS)}")
        self.policy = policy
        self.dtype = sampling_dtype(sampling.dtype, policy)
        # The trainer recomputes (or takes from its forward) the old log-probs when ours
        # come from other kernels than its own (rl.py, train/update.py).
        self.logprobs_match_trainer = self.dtype == policy.dtype
        self.tokenizer = policy.tokenizer
        self.sampling = sampling
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self.eos_ids = _eos_ids(policy)
        self.store = KVStore() if reuse_kv else None
        self.reused_tokens = 0  # context tokens whose keys and values came from the store, not a prefill
        self._sampler: Any = None
        # Called after every sampled token with the row's request and its tokens so far;
        # True ends that row now, finish_reason "abort" (a server streams text through
        # it and stops rows whose own stop string appeared or whose client went away).
        self.on_token: Callable[[GenerationRequest, list[int]], bool] | None = None

    def refresh(self) -> None:
        """The policy's weights changed: rebuild the sampling copy on next use."""
        cyclic = self._sampler is not None and not isinstance(self._sampler, LlamaDecoder)
        self._sampler = None  # a lean decoder is freed here (no reference cycles)
        if self.store is not None:
            self.store.clear()
        if cyclic:
            gc.collect()  # a transformers copy's modules hold reference cycles; free its 0.5 GB now
        # its tensors, freed, would stay in the heap under the update that follows (SmolLM2:
        # 2.2 GB resident after a refresh without this, 1.0 GB with it)
        trim_heap()

    def snapshot(self) -> None:
        """Asynchronous rollouts: take the sampling copy now, so the update that follows
        does not move the weights later generate calls sample from. A LoRA policy's
        only: without adapters the copy shares the weights full fine-tuning changes."""
        if not is_lora(self.policy.model):
            raise ValueError("train.async_rollouts in one process needs lora.enabled: the sampling copy "
                             "shares the weights full fine-tuning changes in place; "
                             "use rollout.backend=vllm or --ray")
        self.refresh()
        self.sampling_model()

    def sampling_model(self) -> Any:
        """The model to sample from, with LoRA adapters merged (PEFT's per-layer adapter
        matmuls double the cost of a decode step, and merging in place would drift the
        base weights): ponder's lean decoder for Llama-family models on the CPU
        (`rollout.llama_decode`), else a merged copy of the transformers model."""
        if self._sampler is None:
            from ponder.models.lora_fused import drop_base_copies

            wanted = self.sampling.decoder != "transformers"
            lean = lean_decoder(self.policy.model, self.dtype, pack=not self._static()) if wanted else None
            self._sampler = lean if lean is not None else _merged_copy(self.policy.model).to(self.dtype)
            drop_base_copies(self.policy.model)  # the update remakes them once the sampler is dropped
        return self._sampler

    def generate(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        if not requests:
            return []
        if self.policy.device.type != "cpu":
            return self._generate(requests, stop_strings)
        # Fewer threads while other processes hold the cores (ponder.models.cpu_threads).
        with cpu_block():
            return self._generate(requests, stop_strings)

    def continuous(self) -> bool:
        """Whether rows can join a running batch here (ponder.rollout.continuous): the
        eager decode loop, not the GPU's static-shape steps."""
        return not self._graphed(self.sampling_model())

    def generate_continuous(self, first: list[GenerationRequest], admit: Callable[[int], list[GenerationRequest]],
                            done: Callable[[GenerationRequest, Generation], None], max_batch: int) -> int:  # fmt: skip
        """Continuous batching (ponder.rollout.continuous.generate_continuous)."""
        from ponder.rollout.continuous import generate_continuous

        return generate_continuous(self, first, admit, done, max_batch)

    @torch.no_grad()
    def _generate(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        model = self.sampling_model()
        if self._graphed(model):
            return self._generate_graphed(model, requests, stop_strings)
        rows = self._rows(requests)  # a bad constraint fails before the prefill
        cache, logits, attention_mask, next_position = self._prefill(model, requests)
        batch = list(range(len(rows)))  # rows[batch[j]] is batch row j
        live = list(range(len(rows)))  # batch rows still generating
        while True:
            unmasked = self._unmasked(rows, batch, live, logits)  # before the mask changes logits in place
            token_list, logprob_list, tokens = self._sample(self._constrain(logits, rows, batch, live))
            self._book_unmasked(rows, batch, unmasked, tokens)
            live = self._book(rows, batch, live, token_list, logprob_list, stop_strings, cache, attention_mask)
            if not live:
                break
            if _compact(live, batch):  # drop finished rows from the batch and the cache
                index = torch.tensor(live, device=attention_mask.device)
                cache.batch_select_indices(index)
                attention_mask, next_position, tokens = attention_mask[index], next_position[index], tokens[index]
                batch, live = [batch[j] for j in live], list(range(len(live)))
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(batch), 1)], dim=1)
            out = model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=attention_mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            logits, next_position = out.logits[:, -1], next_position + 1
        return [self._to_generation(row) for row in rows]

    def _static(self) -> bool:
        """Decode through `GraphStep`s: on a GPU by default (`decoder: auto`), anywhere
        with `decoder: static` or `compiled` (eagerly off CUDA)."""
        return self.sampling.decoder in ("static", "compiled") or self._compiled()

    def _compiled(self) -> bool:
        """Compile the steps: `decoder: compiled`, or `auto` on a GPU."""
        on_gpu = self.policy.device.type == "cuda"
        return self.sampling.decoder == "compiled" or (self.sampling.decoder == "auto" and on_gpu)

    def _graphed(self, model: Any) -> bool:
        return self._static() and isinstance(model, LlamaDecoder)

    def _generate_graphed(self, model: LlamaDecoder, requests: list[GenerationRequest],
                          stop_strings: list[str]) -> list[Generation]:  # fmt: skip
        """The decode loop on static shapes (rollout.graph_decode). The step after a
        sample is launched before the sample is read back, so the GPU computes it while
        the rows are booked here (a finished row's extra token is never recorded).
        Finished rows stay in the batch until half of it has finished, then the live
        rows get a step of their own."""
        rows = self._rows(requests)
        cache, logits, attention_mask, next_position = self._prefill(model, requests, pad_slots=True)
        step = GraphStep.after_prefill(model, cache, attention_mask, next_position, self._compiled())
        del cache
        batch = list(range(len(rows)))  # rows[batch[j]] is step row j
        live = list(range(len(rows)))  # step rows still generating
        while live:
            unmasked = self._unmasked(rows, batch, live, logits)  # before the mask changes logits in place
            logits = self._constrain(logits, rows, batch, live)
            tokens, logprobs = sample_tokens(logits, self.sampling.temperature, self.sampling.top_p, self.generator)
            self._book_unmasked(rows, batch, unmasked, tokens)
            sampled = _HostCopy(torch.stack([tokens.double(), logprobs.double()]))
            logits = step(tokens)  # queued behind the copy: runs while this loop books the rows
            token_list, logprob_list = sampled.wait()
            # a finished row keeps the slots read before its last token (the step above read it too)
            read = step.attention_mask()[:, :-1]
            live = self._book(rows, batch, live, token_list, logprob_list, stop_strings, step, read)
            if live and len(live) <= len(batch) // 2:  # the live rows in a step (new graphs) of their own
                logits, step, batch = logits[live], step.select(live), [batch[j] for j in live]
                live = list(range(len(live)))
        return [self._to_generation(row) for row in rows]

    def _rows(self, requests: list[GenerationRequest]) -> list[_Row]:
        """A row per request, with a fresh matcher of its constraint (compiled once per
        constraint and tokenizer: ponder.rollout.constrain)."""
        if not any(r.constraint is not None for r in requests):
            return [_Row(r, [], []) for r in requests]
        grammars = self._grammars()
        rows = []
        for r in requests:
            starts = r.constraint is not None and not r.constraint.trigger
            waiting = r.constraint is not None and bool(r.constraint.trigger)
            rows.append(_Row(r, [], [], matcher=grammars.matcher(r.constraint) if starts else None, waiting=waiting))
        return rows

    def _grammars(self) -> Any:
        return grammars_for(self.tokenizer, self.eos_ids, self.policy.model.config.vocab_size)

    def _switch_on(self, row: _Row) -> None:
        """A triggered constraint: once the row's text has written the trigger, its
        grammar governs the rest (ponder.rollout.constrain.opened)."""
        found, row.matcher = opened(self._grammars(), self.tokenizer, row.request.constraint, row.token_ids)
        row.waiting = not found

    @staticmethod
    def _constrain(logits: torch.Tensor, rows: list[_Row], batch: list[int], live: list[int]) -> torch.Tensor:
        """logits with each live constrained row's forbidden tokens at -inf."""
        matchers: list[Matcher | None] = [None] * len(batch)
        for j in live:
            matchers[j] = rows[batch[j]].matcher
        return mask_logits(logits, matchers)

    def _unmasked(self, rows: list[_Row], batch: list[int], live: list[int],
                  logits: torch.Tensor) -> tuple[list[int], torch.Tensor] | None:  # fmt: skip
        """The live constrained rows and their log-softmax before the grammar's mask
        (at the sampling temperature), or None when no live row has a constraint."""
        constrained = [j for j in live if rows[batch[j]].request.constraint is not None]
        if not constrained:
            return None
        chosen = logits[torch.tensor(constrained, device=logits.device)].float()
        temperature = self.sampling.temperature
        return constrained, torch.log_softmax(chosen if temperature <= 0 else chosen / temperature, dim=-1)

    def _book_unmasked(self, rows: list[_Row], batch: list[int], unmasked: tuple[list[int], torch.Tensor] | None,
                       tokens: torch.Tensor) -> None:  # fmt: skip
        """Each constrained row's sampled token's logprob under the unmasked distribution
        (Generation.policy_logprobs): what a trainer that does not replay the row's
        grammar recomputes."""
        if unmasked is None:
            return
        constrained, logprobs = unmasked
        picked = tokens[torch.tensor(constrained, device=tokens.device)].unsqueeze(-1)
        for j, logprob in zip(constrained, logprobs.gather(-1, picked).squeeze(-1).tolist()):
            rows[batch[j]].policy_logprobs.append(logprob)

    def _sample(self, logits: torch.Tensor) -> tuple[list[int], list[float], torch.Tensor]:
        tokens, logprobs = sample_tokens(logits, self.sampling.temperature, self.sampling.top_p, self.generator)
        # One device-to-host copy per step, not one per row (each is a GPU sync).
        return tokens.tolist(), logprobs.tolist(), tokens

    def _book(self, rows: list[_Row], batch: list[int], live: list[int], tokens: list, logprobs: list,
              stop_strings: list[str], cache: Any, mask: torch.Tensor) -> list[int]:  # fmt: skip
        """Record each live batch row's sampled token; keep the past of each row that
        finished (batch row j of `cache`, the slots mask[j] marks). Returns the rows
        still generating."""
        still = []
        for j in live:
            if not self._record(rows[batch[j]], int(tokens[j]), logprobs[j], stop_strings):
                still.append(j)
            else:
                self._keep_past(rows[batch[j]], cache, mask[j], j)
        return still

    def _record(self, row: _Row, token: int, logprob: float, stop_strings: list[str]) -> bool:
        """Append a sampled token to its row; True when the row has finished."""
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if row.matcher is not None and not row.matcher.done:
            row.matcher.advance(token)
        elif row.waiting:
            self._switch_on(row)
        row.finish_reason = self._finish_reason(row, stop_strings)
        if self.on_token is not None and self.on_token(row.request, row.token_ids) and not row.finish_reason:
            row.finish_reason = "abort"
        return bool(row.finish_reason)

    def _keep_past(self, row: _Row, cache: Any, mask: torch.Tensor, j: int) -> None:
        """What a finished row's model has read (batch row j of `cache`, the slots
        `mask` marks), kept for the episode's next turn."""
        if self.store is not None:
            slots = mask.nonzero().squeeze(-1)
            self.store.put(row.request.key, row.request.context_ids + row.token_ids[:-1], cache.row(j, slots))

    def _prefill(self, model: Any, requests: list[GenerationRequest],
                 pad_slots: bool = False) -> tuple[SlabCache, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Read every request's unread tokens on top of its past; returns the cache, the
        last position's logits [B, V], the attention mask [B, slots] and next positions
        [B, 1]. `pad_slots` rounds the cache's capacity up to a multiple of 64 (fewer
        distinct shapes for the GPU's attention kernels)."""
        pasts = self._pasts(model, requests)
        seen = [past_length(p) for p in pasts]
        new = [r.context_ids[n:] for r, n in zip(requests, seen)]
        width = max(seen)
        capacity = width + max(len(x) for x in new) + max(r.max_new_tokens for r in requests)
        capacity = -(-capacity // 64) * 64 if pad_slots else capacity
        device = self.policy.device
        cache = SlabCache(model.config.num_hidden_layers, capacity, pasts, width)
        del pasts  # each layer's pasts are freed once copied into its slab: not two caches at once
        input_ids, new_mask = self._left_pad(new)
        past_mask = torch.tensor([[0] * (width - n) + [1] * n for n in seen], device=device, dtype=new_mask.dtype)
        positions = (torch.tensor(seen, device=device).unsqueeze(1) + new_mask.cumsum(-1) - 1).clamp(min=0)
        attention_mask = torch.cat([past_mask.reshape(len(requests), width), new_mask], dim=1)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # a vocabulary-sized matmul per prompt token would be wasted
        )
        return cache, out.logits[:, -1], attention_mask, positions[:, -1:] + 1

    def _pasts(self, model: Any, requests: list[GenerationRequest]) -> list[RowKV | None]:
        """Each request's cached past: the episode's previous turn from the store, or else
        a shared prefill, whichever reads fewer tokens: one of the prefix common to every
        new episode (the system prompt, ~2/3 of a search-QA prompt), or one of all but
        the last token per distinct context (the G samples of a task)."""
        if self.store is None:
            return [None] * len(requests)
        pasts = self.store.take_all([r.key for r in requests], [r.context_ids for r in requests])
        self.reused_tokens += sum(past_length(p) for p in pasts)
        fresh = [i for i, r in enumerate(requests) if pasts[i] is None and len(r.context_ids) > 1]
        if not fresh:
            return pasts
        contexts = [requests[i].context_ids for i in fresh]
        by_prompt: dict[tuple[int, ...], list[int]] = {}  # all but the last token -> requests
        for i, context in zip(fresh, contexts):
            by_prompt.setdefault(tuple(context[:-1]), []).append(i)
        common = shared_prefix_length(contexts)
        per_prompt = sum(len(p) for p in by_prompt) + len(fresh)
        shared = common + sum(len(c) - common for c in contexts)
        if common > 0 and shared < per_prompt:
            groups = {tuple(contexts[0][:common]): fresh}
        else:
            groups = by_prompt
        for kv, members in zip(self._read(model, [list(p) for p in groups]), groups.values(), strict=True):
            for i in members:
                pasts[i] = kv
        return pasts

    def _read(self, model: Any, prefixes: list[list[int]]) -> list[RowKV]:
        """The keys and values of each token sequence, read in one batched pass."""
        input_ids, mask = self._left_pad(prefixes)
        cache = SlabCache(model.config.num_hidden_layers, input_ids.shape[1], [None] * len(prefixes), 0)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
              use_cache=True, logits_to_keep=1)  # fmt: skip
        return [cache.row(j, mask[j].nonzero().squeeze(-1)) for j in range(len(prefixes))]

    def _finish_reason(self, row: _Row, stop_strings: list[str]) -> str:
        if row.token_ids[-1] in self.eos_ids:
            return "eos"
        if stop_strings:
            tail = self.tokenizer.decode(row.token_ids[-_STOP_WINDOW_TOKENS:], skip_special_tokens=False)
            if first_stop(tail, stop_strings) >= 0:
                return "stop"
        if len(row.token_ids) >= row.request.max_new_tokens:
            return "length"
        return ""

    def _to_generation(self, row: _Row) -> Generation:
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        unmasked = row.policy_logprobs[: len(row.token_ids)] if row.request.constraint is not None else None
        return Generation(row.token_ids, row.logprobs, text, row.finish_reason, unmasked)

    def _left_pad(self, contexts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(c) for c in contexts)
        pad = self.tokenizer.pad_token_id
        ids = [[pad] * (width - len(c)) + c for c in contexts]
        mask = [[0] * (width - len(c)) + [1] * len(c) for c in contexts]
        device = self.policy.device
        return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


class _HostCopy:
    """A device tensor's copy to host memory, queued now, read by `wait()` as lists."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.event = None
        if tensor.device.type == "cuda":
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = tensor

    def wait(self) -> list[Any]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


COMPACT_AT = 0.75
SMALL_BATCH = 16


def _compact(live: list[int], batch: list[int]) -> bool:
    """Whether to drop the finished rows from the batch now. Dropping copies every
    layer's cache; keeping a finished row costs its share of each step. At batch 32
    and 128, dropping whenever a row finished spent a quarter of the generation in
    copies, so there finished rows stay until a quarter of the batch has finished; at
    batch 8 the copies are small and dropping at once was faster (docs/results/benchmarks.md,
    "Finished rows"). The GPU's static steps (`_generate_graphed`) wait for half:
    there a smaller batch means new CUDA graphs."""
    if len(batch) <= SMALL_BATCH:
        return len(live) < len(batch)
    return len(live) <= len(batch) * COMPACT_AT


def _merged_copy(model: Any) -> Any:
    model = copy.deepcopy(model)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model.eval()


def sampling_dtype(name: str, policy: Policy) -> torch.dtype:
    """`rollout.sampling.dtype` as a torch dtype: `auto` is bfloat16 for a float32 model
    on a CPU with bf16 instructions (cpu_matmul.native_bf16), else the model's own."""
    return cpu_matmul.matmul_dtype(name, "rollout.sampling.dtype", policy.dtype, policy.device)


def shared_prefix_length(contexts: list[list[int]]) -> int:
    """Length of the prefix every context shares, leaving each at least one token to read."""
    limit = min(len(c) for c in contexts) - 1
    first = contexts[0]
    for n in range(limit):
        if any(c[n] != first[n] for c in contexts):
            return n
    return max(limit, 0)


def _eos_ids(policy: Policy) -> set[int]:
    ids = {policy.tokenizer.eos_token_id}
    configured = getattr(getattr(policy.model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(configured)
    return {i for i in ids if i is not None}
