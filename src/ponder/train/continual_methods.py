"""Continual-learning methods, registered by name (`continual.method`), for a sequence
of task families (ponder.jobs.sequence) or the pipeline's stages.

Each method is a class built from the ContinualConfig; the caller drives it the same
way whatever its name:

    method = build_method(cfg, seed, micro_batch_size, run_dir)
    method.begin(policy)
    for each family i:
        method.start_family(policy, i)
        SFTInputs(train, **method.sft_inputs())          # rehearsal buffer, step hook
        ... train ...
        method.end_family(policy, i, train)              # consolidate, fill the memory
        method.score(policy, j, examples_of_j, count)    # evaluation (adapter routing)
    method.merged_policy(policy)                         # lora_per_task's merge, else None

- naive: plain sequential fine-tuning.
- replay: a reservoir buffer of earlier families' examples fills replay_ratio of each batch.
- ewc / mas / si: a quadratic anchor penalty with the diagonal Fisher, MAS's output
  sensitivity or SI's path integral as the importance (rehearsal too when
  replay_capacity > 0).
- agem: the step's gradient projected off the direction that would raise the loss on a
  batch from the episodic memory (A-GEM).
- derpp: DER++'s logit matching plus NLL on buffered examples stored with their logits.
- lora_per_task: a fresh LoRA adapter per family, the family's own (or the nearest
  by prompt) at evaluation, optionally merged at the end with `ponder merge`'s methods.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ponder.algos.continual import agem_project, derpp_logit_term, nearest_centroid
from ponder.config import ContinualConfig
from ponder.data.format import TokenizedExample
from ponder.models.adapters import is_lora, load_trainable_state, read_manifest, save_trained, trainable_state
from ponder.registry import Registry
from ponder.train.continual import (
    EWCState,
    MASState,
    ReservoirBuffer,
    SIState,
    StepHook,
    StoredLogits,
    assistant_logits,
    record_logits,
    stored_logits_batch,
)
from ponder.train.sft import masked_nll_pass, sft_batch

#: continual.method -> the method's class. Traits: `buffer`, what replay_capacity sizes:
#: "none" (it must be 0), "rehearsal" (mixed into batches; required), "optional"
#: (rehearsal when > 0), "memory" (read by the method, never mixed; required);
#: `weight`, the ContinualConfig field that must be > 0; `needs_path`, it must see the
#: earlier task's training steps (SI's path integral), so it cannot start from a
#: finished stage; `isolates`, it keeps one adapter per task (needs LoRA).
CONTINUAL_METHODS: Registry[type] = Registry(
    "continual method", {"buffer": "none", "weight": "", "needs_path": False, "isolates": False}
)
CountFn = Callable[[Any, list[TokenizedExample]], dict[str, int]]


def resolve_method(cfg: ContinualConfig) -> str:
    """continual.method, or for an empty one the method the older fields meant: `ewc`
    when ewc_lambda > 0 (with rehearsal when replay_capacity > 0), else `replay` when
    replay_capacity > 0, else `naive`."""
    if cfg.method:
        return cfg.method
    return "ewc" if cfg.ewc_lambda > 0 else "replay" if cfg.replay_capacity > 0 else "naive"


def check_continual(cfg: ContinualConfig, where: str = "continual") -> str:
    """The method's name, after refusing settings it cannot run with (one line each)."""
    from ponder.models.merge import METHODS as MERGE_METHODS

    name = resolve_method(cfg)
    CONTINUAL_METHODS.check(name, f"{where}.method")
    buffer, weight = CONTINUAL_METHODS.trait(name, "buffer"), CONTINUAL_METHODS.trait(name, "weight")
    if buffer in ("rehearsal", "memory") and cfg.replay_capacity <= 0:
        raise ValueError(f"{where}.method {name}: set {where}.replay_capacity > 0 (the size of its buffer)")
    if buffer == "none" and cfg.replay_capacity > 0:
        raise ValueError(f"{where}.replay_capacity: method {name} keeps no buffer; set it to 0, or use "
                         "replay (or ewc, si, mas, which rehearse when it is > 0)")  # fmt: skip
    if weight and getattr(cfg, weight) <= 0:
        raise ValueError(f"{where}.method {name}: set {where}.{weight} > 0 (its penalty weight)")
    if buffer == "memory" and cfg.memory_batch_size <= 0:
        raise ValueError(f"{where}.memory_batch_size: must be > 0 for {name}, got {cfg.memory_batch_size}")
    ROUTERS.check(cfg.lora_router, f"{where}.lora_router")
    if cfg.lora_merge:
        MERGE_METHODS.check(cfg.lora_merge, f"{where}.lora_merge")
        if not 0 < cfg.lora_merge_density <= 1:
            raise ValueError(f"{where}.lora_merge_density: must be in (0, 1], got {cfg.lora_merge_density}")
    return name


def build_method(
    cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: str | Path
) -> ContinualMethod:
    """The configured method, checked (check_continual)."""
    return CONTINUAL_METHODS.get(check_continual(cfg))(cfg, seed, micro_batch_size, Path(run_dir))


def add_counts(total: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    """total += counts, key by key (the evaluation's right / total tallies)."""
    for key, value in counts.items():
        total[key] = total.get(key, 0) + value
    return total


class ContinualMethod:
    """The base of every method: each hook a no-op but the rehearsal buffer's (trait
    `buffer` "rehearsal", or "optional" with replay_capacity > 0)."""

    def __init__(self, cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: Path) -> None:
        self.cfg, self.seed, self.micro_batch_size, self.run_dir = cfg, seed, micro_batch_size, run_dir
        rehearses = CONTINUAL_METHODS.trait(resolve_method(cfg), "buffer") in ("rehearsal", "optional")
        buffered = rehearses and cfg.replay_capacity > 0
        self.replay = ReservoirBuffer(cfg.replay_capacity, seed) if buffered else None
        self.hook: StepHook | None = None

    def begin(self, policy: Any) -> None:
        """Before anything is trained or scored."""

    def start_family(self, policy: Any, index: int) -> None:
        """Before family `index` trains."""

    def sft_inputs(self) -> dict[str, Any]:
        """SFTInputs' continual fields: the rehearsal buffer, its ratio, the step hook."""
        ratio = self.cfg.replay_ratio if self.replay is not None else 0.0
        return {"replay": self.replay, "replay_ratio": ratio, "continual": self.hook}

    def end_family(self, policy: Any, index: int, examples: list[TokenizedExample]) -> None:
        """After family `index` trained on `examples`: rehearse them from now on."""
        if self.replay is not None:
            self.replay.extend(examples)

    def score(
        self, policy: Any, index: int, examples: list[TokenizedExample], count: CountFn
    ) -> dict[str, int]:
        """The evaluation tallies of family `index`'s held-out `examples`."""
        return count(policy, examples)

    def merged_policy(self, policy: Any) -> Any:
        """A model that stands for the whole sequence besides `policy` (None: none)."""
        return None


@CONTINUAL_METHODS.register("naive")
class Naive(ContinualMethod):
    """Plain sequential fine-tuning: nothing kept from earlier families."""


@CONTINUAL_METHODS.register("replay", buffer="rehearsal")
class Replay(ContinualMethod):
    """Rehearsal: a reservoir of earlier families' examples fills replay_ratio of each batch."""


@CONTINUAL_METHODS.register("ewc", buffer="optional", weight="ewc_lambda")
class EWC(ContinualMethod):
    """EWC: after each family its diagonal Fisher and weights anchor a penalty."""

    def __init__(self, cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: Path) -> None:
        super().__init__(cfg, seed, micro_batch_size, run_dir)
        self.hook = self.state = EWCState(cfg.ewc_lambda)

    def end_family(self, policy: Any, index: int, examples: list[TokenizedExample]) -> None:
        super().end_family(policy, index, examples)
        self.state.consolidate(policy, examples[: self.cfg.fisher_examples])


@CONTINUAL_METHODS.register("mas", buffer="optional", weight="mas_lambda")
class MAS(ContinualMethod):
    """MAS: after each family its output sensitivity and weights anchor a penalty."""

    def __init__(self, cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: Path) -> None:
        super().__init__(cfg, seed, micro_batch_size, run_dir)
        self.hook = self.state = MASState(cfg.mas_lambda)

    def end_family(self, policy: Any, index: int, examples: list[TokenizedExample]) -> None:
        super().end_family(policy, index, examples)
        self.state.consolidate(policy, examples[: self.cfg.fisher_examples])


@CONTINUAL_METHODS.register("si", buffer="optional", weight="si_c", needs_path=True)
class SI(ContinualMethod):
    """SI: the path integral of each family's training anchors a penalty."""

    def __init__(self, cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: Path) -> None:
        super().__init__(cfg, seed, micro_batch_size, run_dir)
        self.hook = self.state = SIState(cfg.si_c, cfg.si_xi)

    def start_family(self, policy: Any, index: int) -> None:
        self.state.begin_task(policy)

    def end_family(self, policy: Any, index: int, examples: list[TokenizedExample]) -> None:
        super().end_family(policy, index, examples)
        self.state.consolidate(policy)


def _flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    return torch.cat([grad.reshape(-1).float() for grad in grads])


def _set_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    for param in params:
        part = flat[offset : offset + param.numel()].view_as(param)
        param.grad = part.to(param.dtype).clone()
        offset += param.numel()


class AGEMHook:
    """A-GEM's step: g is the batch's gradient; g_ref the gradient of the NLL on a batch
    drawn from the memory; the step applies agem_project(g, g_ref)."""

    def __init__(self, memory: ReservoirBuffer, batch_size: int, micro_batch_size: int) -> None:
        self.memory, self.batch_size, self.micro_batch_size = memory, batch_size, micro_batch_size

    def after_backward(self, policy: Any, params: list[torch.nn.Parameter]) -> dict[str, float]:
        if not len(self.memory):
            return {}
        grad = _flat_grads(params)
        for param in params:
            param.grad = None
        rows = self.memory.sample(self.batch_size)
        masked_nll_pass(policy, sft_batch(rows, policy.tokenizer.pad_token_id), self.micro_batch_size)
        ref = _flat_grads(params)
        projected = agem_project(grad, ref)
        _set_grads(params, projected)
        return {
            "sft/agem_dot": float(torch.dot(grad, ref)),
            "sft/agem_dot_after": float(torch.dot(projected, ref)),
            "sft/agem_projected": float(projected is not grad),
        }

    def after_step(self, policy: Any, params: list[torch.nn.Parameter]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.memory.load_state_dict(state["memory"])


@CONTINUAL_METHODS.register("agem", buffer="memory")
class AGEM(ContinualMethod):
    """A-GEM: earlier families' examples (a reservoir memory) constrain each step."""

    def __init__(self, cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: Path) -> None:
        super().__init__(cfg, seed, micro_batch_size, run_dir)
        self.memory: ReservoirBuffer[TokenizedExample] = ReservoirBuffer(cfg.replay_capacity, seed)
        self.hook = AGEMHook(self.memory, cfg.memory_batch_size, micro_batch_size)

    def end_family(self, policy: Any, index: int, examples: list[TokenizedExample]) -> None:
        self.memory.extend(examples)


class DERHook:
    """DER++'s step: α·(logit MSE on one memory batch) + β·(NLL on another) is added to
    the batch's gradient, in micro-batches (each weighted by its share of the batch's
    assistant positions, so the sum is the batch's mean)."""

    def __init__(self, memory: ReservoirBuffer, cfg: ContinualConfig, micro_batch_size: int) -> None:
        self.memory, self.cfg, self.micro_batch_size = memory, cfg, micro_batch_size

    def after_backward(self, policy: Any, params: list[torch.nn.Parameter]) -> dict[str, float]:
        if not len(self.memory):
            return {}
        pad = policy.tokenizer.pad_token_id
        items: list[StoredLogits] = self.memory.sample(self.cfg.memory_batch_size)
        batch = sft_batch([item.example for item in items], pad)
        positions, mse = float(batch.loss_mask.sum()), 0.0
        for start in range(0, len(items), self.micro_batch_size):
            rows = list(range(start, min(start + self.micro_batch_size, len(items))))
            _, logits, mask = assistant_logits(policy, batch.select(rows).to(policy.device))
            values, index = stored_logits_batch([items[i] for i in rows], mask)
            term = derpp_logit_term(logits, values, mask, index) * (float(mask.sum()) / max(positions, 1.0))
            (self.cfg.derpp_alpha * term).backward()
            mse += float(term.detach())
        replayed = sft_batch([item.example for item in self.memory.sample(self.cfg.memory_batch_size)], pad)
        nll = masked_nll_pass(policy, replayed, self.micro_batch_size, scale=self.cfg.derpp_beta)
        return {"sft/derpp_mse": mse, "sft/derpp_nll": nll}

    def after_step(self, policy: Any, params: list[torch.nn.Parameter]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.memory.load_state_dict(state["memory"])


@CONTINUAL_METHODS.register("derpp", buffer="memory")
class DERPP(ContinualMethod):
    """DER++: earlier families' examples are stored with the logits the model gave them
    at the end of their family (top derpp_topk per assistant position), and matched."""

    def __init__(self, cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: Path) -> None:
        super().__init__(cfg, seed, micro_batch_size, run_dir)
        self.memory: ReservoirBuffer[StoredLogits] = ReservoirBuffer(cfg.replay_capacity, seed)
        self.hook = DERHook(self.memory, cfg, micro_batch_size)

    def end_family(self, policy: Any, index: int, examples: list[TokenizedExample]) -> None:
        for example in examples:
            self.memory.add(record_logits(policy, example, self.cfg.derpp_topk))


#: continual.lora_router -> route(method, index, examples) -> the adapter key of each example
ROUTERS: Registry[Callable[..., list[int]]] = Registry("LoRA router")


@ROUTERS.register("task")
def route_by_task(method: LoraPerTask, index: int, examples: list, policy: Any) -> list[int]:
    """Every example of family `index` to that family's adapter (the task identity is known)."""
    return [index] * len(examples)


@ROUTERS.register("centroid")
def route_by_centroid(method: LoraPerTask, index: int, examples: list, policy: Any) -> list[int]:
    """Each example to the trained family whose mean prompt state is nearest (cosine);
    before any family trained, to none (-1: the fresh adapter)."""
    if not method.centroids or not examples:
        return [-1] * len(examples)
    keys = sorted(method.centroids)
    load_trainable_state(policy.model, method.initial)
    states = torch.stack([prompt_state(policy, example) for example in examples])
    chosen = nearest_centroid(states, torch.stack([method.centroids[k] for k in keys]))
    return [keys[int(i)] for i in chosen]


@torch.no_grad()
def prompt_state(policy: Any, example: TokenizedExample) -> torch.Tensor:
    """The mean last-layer hidden state over the tokens before the first assistant token
    (what is known before the model answers) [H], in eval mode."""
    first = example.loss_mask.index(1) if 1 in example.loss_mask else len(example.input_ids)
    ids = torch.tensor([example.input_ids[: max(1, first)]], device=policy.device)
    was_training = policy.model.training
    policy.model.eval()
    out = policy.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True,
                       use_cache=False, logits_to_keep=1)  # fmt: skip
    policy.model.train(was_training)
    return out.hidden_states[-1][0].mean(0).float().cpu()


@CONTINUAL_METHODS.register("lora_per_task", isolates=True)
class LoraPerTask(ContinualMethod):
    """A fresh LoRA adapter per family (the one the policy starts with, B = 0: the base
    model), its trained weights kept in memory (and on disk for a merge); at evaluation
    the router picks the adapter; a family with none yet is scored with the fresh one."""

    def __init__(self, cfg: ContinualConfig, seed: int, micro_batch_size: int, run_dir: Path) -> None:
        super().__init__(cfg, seed, micro_batch_size, run_dir)
        self.initial: dict[str, torch.Tensor] = {}
        self.adapters: dict[int, dict[str, torch.Tensor]] = {}
        self.centroids: dict[int, torch.Tensor] = {}
        self.saved: dict[int, Path] = {}

    def begin(self, policy: Any) -> None:
        if not is_lora(policy.model):
            raise ValueError("continual.method lora_per_task trains one LoRA adapter per family: enable lora")
        self.initial = trainable_state(policy.model)

    def start_family(self, policy: Any, index: int) -> None:
        load_trainable_state(policy.model, self.initial)

    def end_family(self, policy: Any, index: int, examples: list[TokenizedExample]) -> None:
        self.adapters[index] = trainable_state(policy.model)
        if self.cfg.lora_merge:
            self.saved[index] = save_trained(policy, self.run_dir / "adapters" / f"{index}")
        if self.cfg.lora_router == "centroid":
            load_trainable_state(policy.model, self.initial)
            self.centroids[index] = torch.stack([prompt_state(policy, e) for e in examples]).mean(0)
            load_trainable_state(policy.model, self.adapters[index])

    def score(
        self, policy: Any, index: int, examples: list[TokenizedExample], count: CountFn
    ) -> dict[str, int]:
        routes = ROUTERS.get(self.cfg.lora_router)(self, index, examples, policy)
        totals: dict[str, int] = {}
        for key in sorted(set(routes)):
            load_trainable_state(policy.model, self.adapters.get(key, self.initial))
            add_counts(totals, count(policy, [e for e, route in zip(examples, routes) if route == key]))
        return totals

    def merged_policy(self, policy: Any) -> Any:
        """The per-family adapters merged by `ponder merge`'s lora_merge method on their
        full task vectors (models/merging.py), loaded as a plain model; None without."""
        if not self.cfg.lora_merge or not self.saved:
            return None
        from ponder.models.loading import load_policy
        from ponder.models.merging import MergeConfig, MergeParameters, MergeSource, run_merge

        keep = self.cfg.lora_merge_density
        sources = [MergeSource(str(self.saved[i]), 1.0) for i in sorted(self.saved)]
        base = read_manifest(self.saved[min(self.saved)])["base_model"]
        config = MergeConfig(
            merge_method=self.cfg.lora_merge, base_model=base,
            merge_on="full", models=[{"model": s.model, "weight": s.weight} for s in sources],
            parameters=MergeParameters(density=keep, drop_rate=1 - keep, seed=self.seed),
            out=str(self.run_dir / "merged"),
        )  # fmt: skip
        out = run_merge(config, sources, str(self.run_dir), overwrite=True)
        return load_policy(str(out), device=str(policy.device))
