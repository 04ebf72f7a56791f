"""One base model, many LoRA adapters, chosen per request.

Every adapter is loaded into one PEFT model (`PeftModel.from_pretrained` for the
first, `load_adapter` for the rest), so the base weights are held once. Sampling goes
through the `hf` backend; `AdapterBackend` only changes what it samples from:
`sampling_model()` returns the sampler of the adapter the current batch asked for
(`backend.adapter`; None = the base with adapters disabled). On the CPU that is
ponder's lean decoder built with that adapter merged (rollout/llama_decode.py: PEFT's
unmerged adapter matmuls double a decode step); the last few are kept (LRU) and the
base is never merged into, so switching back and forth cannot drift it. Elsewhere
(a GPU, an architecture the lean decoder does not cover) the PEFT model itself
samples, with `set_adapter` / `disable_adapter` around each forward.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ponder.config import SamplingConfig
from ponder.models.adapters import ADAPTER_FILES, MANIFEST, find_trained, is_lora, read_manifest
from ponder.models.loading import Policy
from ponder.rollout.hf import HFBackend
from ponder.rollout.llama_decode import lean_decoder

_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


def parse_adapter_flags(flags: list[str]) -> dict[str, str]:
    """`NAME=PATH` flags as {name: path}; ValueError naming a malformed or repeated one."""
    adapters: dict[str, str] = {}
    for flag in flags:
        name, sep, path = flag.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"--adapter {flag!r}: write NAME=PATH")
        if not _ADAPTER_NAME.match(name):
            raise ValueError(f"--adapter {flag!r}: NAME must be 1-128 letters, digits or . _ : / -")
        if name in adapters:
            raise ValueError(f"--adapter {name!r} given twice")
        adapters[name] = path
    return adapters


def find_adapter(name: str, path: str, base_model: str) -> Path:
    """The PEFT adapter directory in `path`: the directory itself (PEFT's layout, as
    `ponder export` writes), or the final adapter of a ponder run, stage or checkpoint
    directory. ValueError when there is none, when it is a full model, when it was
    trained on top of merged adapters, or when its manifest names another base model."""
    where = Path(path).expanduser()
    flag = f"--adapter {name}={path}"
    if not where.is_dir():
        raise ValueError(f"{flag}: no such directory")
    if all((where / f).is_file() for f in ADAPTER_FILES) and not (where / MANIFEST).is_file():
        return where
    found = find_trained(where)
    if found is None:
        raise ValueError(f"{flag}: neither a PEFT adapter ({' + '.join(ADAPTER_FILES)}) nor a ponder run, "
                         "stage or checkpoint directory")  # fmt: skip
    manifest = read_manifest(found)
    if manifest["kind"] != "lora":
        raise ValueError(f"{flag}: {found} is a fully fine-tuned model, not an adapter; serve it with --model")
    if manifest["stack"]:
        raise ValueError(f"{flag}: {found} was trained on top of {len(manifest['stack'])} merged adapter(s); "
                         "`ponder export --merge` it and serve that with --model")  # fmt: skip
    if not _same_model(manifest["base_model"], base_model):
        raise ValueError(f"{flag}: trained on base model {manifest['base_model']!r}, but the server's "
                         f"--model is {base_model!r}")  # fmt: skip
    return found


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    return Path(a).expanduser().exists() and Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def attach_adapters(policy: Policy, adapters: dict[str, Path]) -> Policy:
    """`policy` with every adapter loaded under its name (none active until a batch
    picks one). ValueError naming an adapter that does not fit the model."""
    if not adapters:
        return policy
    from peft import PeftModel

    model = policy.model
    for name, directory in adapters.items():
        try:
            if is_lora(model):
                model.load_adapter(str(directory), adapter_name=name)
            else:
                model = PeftModel.from_pretrained(model, str(directory), adapter_name=name)
        except (RuntimeError, ValueError, KeyError, OSError, json.JSONDecodeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"--adapter {name}={directory}: does not fit the base model ({first[:200]})") from None
    model.eval()
    return replace(policy, model=model)


@contextlib.contextmanager
def adapter_active(model: Any, adapter: str | None) -> Iterator[None]:
    """`adapter` active on the PEFT model for the block; None disables every adapter."""
    if adapter is None:
        with model.disable_adapter():
            yield
    else:
        model.set_adapter(adapter)
        yield


class _PeftSampler:
    """The PEFT model with one adapter (or none) active around each forward call."""

    def __init__(self, model: Any, adapter: str | None) -> None:
        self.model, self.adapter, self.config = model, adapter, model.config

    def __call__(self, **inputs: Any) -> Any:
        with adapter_active(self.model, self.adapter):
            return self.model(**inputs)


class AdapterBackend(HFBackend):
    """The `hf` backend sampling from the adapter in `self.adapter` (see module docstring).
    One thread drives it (the server's batcher): `adapter` and `sampling` are set per batch.

    `aliases` maps a name jobs use to the PEFT adapter it stands for at the moment (a
    user's `@alice` -> `user:alice@v2`), resolved when a batch starts, so an adapter can
    be swapped for a new version between two batches without touching queued jobs.
    `add_adapter` / `remove_adapter` change the PEFT model: callers hold the batcher's
    lock, so no batch runs meanwhile."""

    def __init__(self, policy: Policy, seed: int = 0, cached_samplers: int = 3) -> None:
        super().__init__(policy, SamplingConfig(temperature=0.0), seed=seed, reuse_kv=False)
        self.adapter: str | None = None
        self.aliases: dict[str, str] = {}
        self.cached_samplers = max(1, cached_samplers)
        self._samplers: OrderedDict[str | None, Any] = OrderedDict()

    def resolve(self, name: str | None) -> str | None:
        """The PEFT adapter a job's adapter name stands for now (None: the base)."""
        return None if name is None else self.aliases.get(name, name)

    def add_adapter(self, name: str, directory: str | Path) -> None:
        """Load the PEFT adapter in `directory` under `name` (caller holds the batcher's lock)."""
        from peft import PeftModel

        model = self.policy.model
        if is_lora(model):
            model.load_adapter(str(directory), adapter_name=name)
        else:
            model = PeftModel.from_pretrained(model, str(directory), adapter_name=name)
            self.policy = replace(self.policy, model=model)
            # samplers built before were built on the bare model, whose layers now carry LoRA
            self._samplers.clear()
        model.eval()

    def remove_adapter(self, name: str) -> None:
        """Unload adapter `name` and its cached sampler (caller holds the batcher's lock)."""
        with warnings.catch_warnings():
            # PEFT warns when the adapter it last activated goes; batches activate their own
            warnings.filterwarnings("ignore", message=r"Adapter .* was active which is now deleted")
            self.policy.model.delete_adapter(name)
        self._samplers.pop(name, None)

    def sampling_model(self) -> Any:
        if self.adapter in self._samplers:
            self._samplers.move_to_end(self.adapter)
            return self._samplers[self.adapter]
        sampler = self._build(self.adapter)
        self._samplers[self.adapter] = sampler
        while len(self._samplers) > self.cached_samplers:
            self._samplers.popitem(last=False)
        return sampler

    def _build(self, adapter: str | None) -> Any:
        model = self.policy.model
        lean_ok = self.sampling.decoder != "transformers"
        if not is_lora(model):
            return (lean_decoder(model) if lean_ok else None) or model
        with adapter_active(model, adapter):
            lean = lean_decoder(model) if lean_ok else None
        return lean if lean is not None else _PeftSampler(model, adapter)
