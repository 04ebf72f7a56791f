"""Several LoRA adapters on one frozen base: each trains alone, all sample together.

`attach_lora_adapters` puts N named adapters on one PEFT model (the base weights held
once). Training is grouped by adapter: `activate(model, name)` makes that adapter the
only active and trainable one (PEFT's `set_adapter`), so a forward, a backward and an
optimizer step touch its weights and no other's; its trainer holds an `AdapterView`,
the model as if it had that one adapter (checkpoints write only its weights, in PEFT's
own layout, loadable as a normal adapter).

Sampling mixes adapters in one batch: inside `rows_with_adapters(names)` every LoRA
linear computes the frozen product x Wᵀ once for the whole batch and adds each row's
own adapter delta, s (x Aᵀ) Bᵀ, computed per group of rows that share an adapter
(ranks may differ between adapters; a row named None gets the base alone). Outside
that block the layers are ponder's fused LoRA linears (models/lora_fused.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ponder.config import LoraConfig
from ponder.models.loading import Policy
from ponder.models.lora_fused import FusedLoraLinear

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_adapter_name(name: Any) -> str:
    """`name` when it is a usable adapter name (1-64 letters, digits, '.', '_', '-'), else ValueError."""
    if not isinstance(name, str) or not ADAPTER_NAME.match(name):
        raise ValueError(f"adapter name {str(name)[:80]!r}: use 1-64 letters, digits, '.', '_' or '-'")
    if name in "lora_":  # PEFT finds an adapter's weights by name inside keys that hold `lora_`
        raise ValueError(f"adapter name {name!r} is part of 'lora_', which PEFT's weight names hold; choose another")
    return name


def adapter_names(model: Any) -> list[str]:
    """The adapters on a PEFT model, in the order they were added."""
    return list(getattr(model, "peft_config", {}))


def check_adapter(model: Any, name: Any) -> str:
    """`name` when the model has that adapter, else a one-line ValueError naming those it has."""
    names = adapter_names(model)
    if name not in names:
        raise ValueError(f"adapter {str(name)[:80]!r} does not exist; this model has {', '.join(names) or 'none'}")
    return name


def attach_lora_adapters(policy: Policy, configs: dict[str, LoraConfig], seeds: dict[str, int] | None = None) -> Policy:
    """The bare `policy` with a fresh LoRA adapter per entry of `configs` (name -> lora
    section), each initialised after `torch.manual_seed(seeds[name])` as `prepare_policy`
    initialises a single run's (so adapter `a` starts where a run of its own recipe
    would). The first adapter is active. ValueError for a bad or repeated name."""
    from peft import get_peft_model

    from ponder.models.cpu_matmul import matmul_dtype
    from ponder.models.lora import peft_lora_config
    from ponder.models.lora_fused import fuse_lora_linears

    if not configs:
        raise ValueError("no adapters to attach")
    if hasattr(policy.model, "peft_config"):
        raise ValueError("attach_lora_adapters takes the bare base model (this one already has adapters)")
    model: Any = policy.model
    for index, (name, config) in enumerate(configs.items()):
        check_adapter_name(name)
        if seeds is not None:
            torch.manual_seed(seeds[name])
        peft_config = peft_lora_config(policy, config)
        if index == 0:
            model = get_peft_model(model, peft_config, adapter_name=name)
        else:
            model.add_adapter(name, peft_config)
    first = next(iter(configs.values()))
    base_dtype = matmul_dtype(first.base_matmul_dtype, "lora.base_matmul_dtype", policy.dtype, policy.device)
    fuse_lora_linears(model, base_dtype)
    row_lora_linears(model)
    activate(model, next(iter(configs)))
    return replace(policy, model=model)


def row_lora_linears(model: Any) -> int:
    """Give every fused LoRA linear of `model` the per-row sampling forward; returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is FusedLoraLinear:
            module.__class__ = RowLoraLinear
            count += 1
    return count


def activate(model: Any, name: str) -> None:
    """Make adapter `name` the only active and trainable one (every other adapter frozen)."""
    model = getattr(model, "peft_model", model)
    check_adapter(model, name)
    model.set_adapter(name)


def adapter_parameters(model: Any, name: str) -> dict[str, torch.nn.Parameter]:
    """Adapter `name`'s LoRA parameters by their module path (A and B of every layer)."""
    model = getattr(model, "peft_model", model)
    check_adapter(model, name)
    marker = f".{name}."
    return {key: p for key, p in model.named_parameters() if "lora_" in key and marker in key}


# --- per-row sampling ---------------------------------------------------------------------


@dataclass(frozen=True)
class RowPlan:
    """Which rows of a batch use which adapter: (name or None for the base, its rows: a
    slice where they are contiguous, else their indices [k])."""

    groups: tuple[tuple[str | None, slice | torch.Tensor], ...]
    rows: int
    masks: dict[Any, torch.Tensor] = field(default_factory=dict, compare=False)  # per rank layout, built once


_PLAN: contextvars.ContextVar[RowPlan | None] = contextvars.ContextVar("ponder_row_adapters", default=None)


def row_plan(names: list[str | None], device: torch.device | str = "cpu") -> RowPlan:
    """The plan for a batch whose row i uses adapter names[i]."""
    order: dict[str | None, list[int]] = {}
    for row, name in enumerate(names):
        order.setdefault(name, []).append(row)
    groups = tuple((name, _rows(rows, device)) for name, rows in order.items())
    return RowPlan(groups, len(names))


def _rows(rows: list[int], device: torch.device | str) -> slice | torch.Tensor:
    """A slice for contiguous rows (a view, no copy), else an index tensor."""
    if rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, device=device, dtype=torch.long)


@contextlib.contextmanager
def rows_with_adapters(names: list[str | None], device: torch.device | str = "cpu") -> Iterator[None]:
    """Forward passes in this block (no gradients) apply adapter names[i] to batch row i."""
    token = _PLAN.set(row_plan(names, device))
    try:
        yield
    finally:
        _PLAN.reset(token)


def current_plan() -> RowPlan | None:
    """The row plan of the enclosing `rows_with_adapters` block, None outside one."""
    return _PLAN.get()


LowRank = tuple[torch.Tensor, torch.Tensor, float]  # A [r, in], B [out, r], scaling


def add_row_deltas(out: torch.Tensor, x: torch.Tensor, plan: RowPlan,
                   low_rank: Callable[[str], LowRank | None]) -> torch.Tensor:  # fmt: skip
    """out (the frozen product for every row of x) plus each row's adapter delta,
    s (x Aᵀ) Bᵀ, computed once per group of rows sharing an adapter; `low_rank(name)`
    gives that adapter's (A, B, s) here, or None where it has none (a row named None
    gets the base alone)."""
    for name, rows in plan.groups:
        found = None if name is None else low_rank(name)
        if found is None:
            continue
        a, b, scaling = found
        part = x[rows] if isinstance(rows, slice) else x.index_select(0, rows)
        delta = ((part.to(a.dtype) @ a.t()) @ b.t()).mul_(scaling).to(out.dtype)
        if isinstance(rows, slice):
            out[rows].add_(delta)
        else:
            out.index_add_(0, rows, delta)
    return out


class RowLoraLinear(FusedLoraLinear):
    """The fused LoRA linear; inside `rows_with_adapters` each row gets its own adapter."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        plan = _PLAN.get()
        if plan is None or args or kwargs:
            return super().forward(x, *args, **kwargs)
        if x.shape[0] != plan.rows:
            raise ValueError(f"rows_with_adapters names {plan.rows} rows, the batch has {x.shape[0]}")
        return add_row_deltas(self.base_layer(x), x, plan, self.low_rank)

    def low_rank(self, name: str) -> LowRank | None:
        if name not in self.lora_A:  # an adapter without this layer (lora.last_n_layers)
            return None
        return self.lora_A[name].weight, self.lora_B[name].weight, float(self.scaling[name])


# --- one adapter seen alone ----------------------------------------------------------------


class AdapterView:
    """A multi-adapter PEFT model as one trainer of adapter `name` sees it: calls and
    attributes go to the model (activate the adapter first: `activate`), and
    `save_pretrained` writes this adapter alone, in PEFT's layout at the directory's top,
    as `PeftModel.from_pretrained(base, DIR)` reads it."""

    def __init__(self, model: Any, name: str) -> None:
        check_adapter(model, name)
        object.__setattr__(self, "peft_model", model)
        object.__setattr__(self, "adapter_name", name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.peft_model, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self.peft_model, attr, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.peft_model(*args, **kwargs)

    def save_pretrained(self, directory: str | Path, **_: Any) -> None:
        save_adapter(self.peft_model, self.adapter_name, directory)


def save_adapter(model: Any, name: str, directory: str | Path) -> Path:
    """Write adapter `name` of `model` as a standalone PEFT adapter directory
    (`adapter_config.json` + `adapter_model.safetensors`)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    check_adapter(model, name)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False)
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()},
              str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    config = copy.deepcopy(model.peft_config[name])
    config.inference_mode = True
    config.save_pretrained(str(directory))
    return directory


def load_adapter_state(model: Any, name: str, directory: str | Path) -> None:
    """Load a PEFT adapter directory's weights into adapter `name` (same shapes)."""
    from peft import set_peft_model_state_dict

    from ponder.models.adapters import saved_weights

    check_adapter(model, name)
    set_peft_model_state_dict(model, saved_weights(directory), adapter_name=name)
