"""`ponder merge CONFIG.yaml`: merge trained models or adapters into one (mergekit-like).

The config names a method (models/merge.py), the base model, the sources with
their weights, the method's parameters and the output directory:

    merge_method: ties          # linear | task_arithmetic | ties | dare_linear | dare_ties
    base_model: smollm2-135m    # or a trained model (a shared warm-up): task vectors from it
    merge_on: full              # full: task vectors on full weights; lora: PEFT on the adapters
    models:
      - {model: runs/math-v3, weight: 1.0}
      - {model: runs/fc-s0, weight: 1.0}
    parameters: {density: 0.5, drop_rate: 0.5, seed: 0, scale: 1.0}
    out: runs/merged-ties

merge_on=full loads each source as a plain model (its adapters, stack included,
merged in), takes its task vector (weights − base) and merges them with ponder's
own functions: exact whatever the sources' ranks or stacks; the result is a full
model. merge_on=lora merges the adapters with PEFT's `add_weighted_adapter` (their
stacks must be empty); the result is an adapter that `ponder serve --adapter`
serves. Either output has ponder's layout (`ponder.json`), so `--model OUT` loads
it everywhere. It is written into a temporary directory next to OUT, synced and
renamed: OUT is either absent or complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ponder.config import ConfigError, from_dict, load_recipe, to_dict
from ponder.fileio import fsync_path
from ponder.models.adapters import MANIFEST, find_trained, read_manifest
from ponder.models.loading import Policy, load_policy
from ponder.models.merge import METHODS, merge_deltas


@dataclass
class MergeParameters:
    """density: TIES's kept fraction of each task vector (largest magnitudes).
    drop_rate: DARE's drop probability p (survivors scaled by 1/(1−p)).
    seed: DARE's random drops. scale: λ, the merged task vector's multiplier.
    svd_rank: merge_on=lora only: merge full updates BA and cut them back to this
        rank by SVD (PEFT's *_svd variants) instead of merging the factors."""

    density: float = 1.0
    drop_rate: float = 0.0
    seed: int = 0
    scale: float = 1.0
    svd_rank: int | None = None


@dataclass
class MergeSource:
    model: str = ""
    weight: float = 1.0


@dataclass
class MergeConfig:
    merge_method: str = ""
    base_model: str = "smollm2-135m"
    merge_on: str = "full"
    models: list = field(default_factory=list)
    parameters: MergeParameters = field(default_factory=MergeParameters)
    out: str = ""
    dtype: str = "float32"


def load_merge_config(path: str, overrides: list[str] | None = None) -> tuple[MergeConfig, list[MergeSource]]:
    """The config and its sources, or a ConfigError naming the file and key."""
    if not Path(path).is_file():
        raise ConfigError(f"{path}: no such merge config")
    config = load_recipe(path, overrides, cls=MergeConfig)
    where = str(path)
    if config.merge_method not in METHODS:
        raise ConfigError(f"{where}: key 'merge_method' must be one of {', '.join(METHODS)}, got {config.merge_method!r}")
    if config.merge_on not in ("full", "lora"):
        raise ConfigError(f"{where}: key 'merge_on' must be full or lora, got {config.merge_on!r}")
    if not config.out:
        raise ConfigError(f"{where}: key 'out' is required (the merged model's directory)")
    params = config.parameters
    if not 0 < params.density <= 1:
        raise ConfigError(f"{where}: key 'parameters.density' must be in (0, 1], got {params.density}")
    if not 0 <= params.drop_rate < 1:
        raise ConfigError(f"{where}: key 'parameters.drop_rate' must be in [0, 1), got {params.drop_rate}")
    if not config.models:
        raise ConfigError(f"{where}: key 'models' must list at least one {{model, weight}}")
    sources = [from_dict(MergeSource, entry, where, f"models[{i}].") for i, entry in enumerate(config.models)]
    for i, source in enumerate(sources):
        if not source.model:
            raise ConfigError(f"{where}: key 'models[{i}].model' is required")
    return config, sources


def run_merge(config: MergeConfig, sources: list[MergeSource], source_file: str, overwrite: bool = False) -> Path:
    """Merge as `config` says and write the result atomically to config.out."""
    out = Path(config.out)
    if out.exists() and any(out.iterdir()):
        if not overwrite or not (out / MANIFEST).is_file():
            raise ValueError(f"{out}: exists and is not empty; choose another 'out' or pass --overwrite "
                             "(which replaces only a ponder model directory)")  # fmt: skip
    dirs = [_source_dir(s.model, source_file, i) for i, s in enumerate(sources)]
    trained_base = Path(config.base_model).exists()
    base_dir = _source_dir(config.base_model, source_file, "base_model") if trained_base else None
    if base_dir is not None and config.merge_on == "lora":
        raise ConfigError(f"{source_file}: key 'base_model': {config.base_model} is a trained model; "
                          "its adapters are inside the sources' own, so only merge_on: full "
                          "subtracts it")
    base_name = read_manifest(base_dir)["base_model"] if base_dir is not None else config.base_model
    base = load_policy(config.base_model, config.dtype, "cpu")
    for i, directory in enumerate(dirs):
        if directory is not None and read_manifest(directory)["base_model"] != base_name:
            raise ConfigError(f"{source_file}: key 'models[{i}].model': {sources[i].model} was trained on "
                              f"{read_manifest(directory)['base_model']!r}, not base_model's {base_name!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        if config.merge_on == "full":
            _merge_full(config, sources, base, staging)
        else:
            _merge_lora(config, sources, dirs, base, staging, source_file)
        manifest = {"format": 1, "kind": "full" if config.merge_on == "full" else "lora",
                    "base_model": base_name, "stack": [],
                    "merge": {**to_dict(config), "models": [to_dict(s) for s in sources]}}  # fmt: skip
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync_tree(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
        fsync_path(out.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _source_dir(model: str, source_file: str, index: int | str) -> Path | None:
    """The ponder weights directory of a source (index: its place in `models`, or the
    key that names it); None for a plain Hugging Face model."""
    key = f"models[{index}].model" if isinstance(index, int) else index
    path = Path(model)
    if not path.exists():
        raise ConfigError(f"{source_file}: key '{key}': {model} does not exist")
    if (path / "config.json").is_file() and not (path / MANIFEST).is_file():
        return None
    found = find_trained(path)
    if found is None:
        raise ConfigError(f"{source_file}: key '{key}': {model} holds no trained weights "
                          f"(no {MANIFEST}, checkpoints/latest, rl/ or sft/)")  # fmt: skip
    return found


def _merge_full(config: MergeConfig, sources: list[MergeSource], base: Policy, staging: Path) -> None:
    """Task vectors of every weight, merged one weight at a time into the base."""
    base_state = {k: v.detach().clone() for k, v in base.model.state_dict().items()}
    states = []
    for source in sources:
        model = load_policy(source.model, config.dtype, "cpu").model
        states.append({k: v.detach() for k, v in model.state_dict().items()})
        del model
    generator = torch.Generator().manual_seed(config.parameters.seed)
    params, weights = config.parameters, [s.weight for s in sources]
    merged: dict[str, torch.Tensor] = {}
    for name in sorted(base_state):  # a fixed order: DARE's drops depend only on the seed
        reference = base_state[name]
        if not reference.is_floating_point():
            continue
        deltas = [state[name].to(reference.dtype) - reference for state in states]
        if all(not d.any() for d in deltas):
            continue  # no source changed this weight (LoRA leaves most untouched)
        delta = merge_deltas(config.merge_method, deltas, weights, params.density, params.drop_rate, generator)
        merged[name] = reference + params.scale * delta.to(reference.dtype)
    base.model.load_state_dict(merged, strict=False)
    base.model.save_pretrained(staging, safe_serialization=True)
    base.tokenizer.save_pretrained(staging)


def _merge_lora(
    config: MergeConfig, sources: list[MergeSource], dirs: list[Path | None], base: Policy, staging: Path, where: str
) -> None:
    """The adapters merged by PEFT's add_weighted_adapter into one adapter."""
    from peft import PeftModel

    for i, directory in enumerate(dirs):
        manifest = read_manifest(directory) if directory is not None else None
        if manifest is None or manifest["kind"] != "lora" or manifest["stack"]:
            why = "is not a LoRA adapter" if manifest is None or manifest["kind"] != "lora" else (
                "was trained on top of merged adapters (a stack)")
            raise ConfigError(f"{where}: key 'models[{i}].model': {sources[i].model} {why}; use merge_on: full")
    names = [f"source{i}" for i in range(len(dirs))]
    model: Any = PeftModel.from_pretrained(base.model, str(dirs[0]), adapter_name=names[0])
    for name, directory in zip(names[1:], dirs[1:]):
        model.load_adapter(str(directory), adapter_name=name)
    params = config.parameters
    weights = [s.weight * params.scale for s in sources]
    if METHODS.trait(config.merge_method, "normalizes"):
        weights = [w / sum(s.weight for s in sources) for w in weights]
    combination = METHODS.trait(config.merge_method, "peft")
    density = 1 - params.drop_rate if METHODS.trait(config.merge_method, "drops") else params.density
    extra: dict[str, Any] = {}
    if params.svd_rank is not None and combination != "cat":
        combination, extra = f"{combination}_svd", {"svd_rank": params.svd_rank}
    torch.manual_seed(params.seed)  # PEFT's DARE draws its drops from torch's global generator
    kwargs = {"density": density} if combination.startswith(("ties", "dare")) else {}
    model.add_weighted_adapter(names, weights, "merged", combination_type=combination, **kwargs, **extra)
    for name in names:
        model.delete_adapter(name)
    model.save_pretrained(staging, selected_adapters=["merged"], save_embedding_layers=False)
    nested = staging / "merged"
    for file in nested.iterdir():
        os.replace(file, staging / file.name)
    nested.rmdir()
    (staging / "README.md").unlink(missing_ok=True)


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    fsync_path(directory)

