"""Trained weights in the field's formats, and loading them back from any run.

Every directory ponder saves trained weights into is readable without ponder:

- LoRA: PEFT's layout, `adapter_config.json` + `adapter_model.safetensors`, so
  `peft.PeftModel.from_pretrained(base, DIR)` loads it;
- full fine-tuning: a Hugging Face model directory (`config.json`,
  `model.safetensors`, tokenizer files).

Next to them `ponder.json` (the manifest) names the base model and the `stack`:
earlier adapters that were merged into the base before this one trained (a
pipeline's earlier stages, or a run that started from a trained model). Paths in
the stack are stored relative to the manifest, so a run directory can be moved.

`find_trained(path)` maps a run, a stage or a checkpoint directory to the one
directory that holds its final weights; `load_trained` loads it as a plain
(merged) policy; `export_trained` writes a standalone model or adapter.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ponder.fileio import write_json_atomic
from ponder.models.loading import ModelLoadError, Policy, load_policy

MANIFEST = "ponder.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# Subdirectories that hold a run's weights, latest stage first: a demo's RL then SFT stage.
STAGE_DIRS = ("rl", "sft")


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def effective_weight(module: Any) -> torch.Tensor:
    """A linear layer's weight [out, in] as the forward pass applies it: the base
    weight plus the deltas of its active, unmerged PEFT LoRA adapters."""
    base = getattr(module, "base_layer", module)
    weight = base.weight.detach()
    if hasattr(module, "lora_A") and not module.disable_adapters and not module.merged:
        for name in module.active_adapters:
            if name in module.lora_A:  # the sum in the adapter's precision (fp32), stored in the base's
                delta = module.get_delta_weight(name).detach()
                weight = (weight.to(delta.dtype) + delta).to(base.weight.dtype)
    return weight


def merged_weights(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights as a plain checkpoint holds them (transformers' names), with
    every active LoRA adapter's delta added into its layer's weight: what a server
    that runs no adapters must load to sample from this policy. Tied weights appear
    once (named_parameters' order)."""
    base = model.get_base_model() if is_lora(model) else model
    out: dict[str, torch.Tensor] = {}
    merged: set[int] = set()  # the parameters of LoRA layers: base weights and the adapters
    for name, module in base.named_modules():
        if hasattr(module, "lora_A"):
            out[f"{name}.weight"] = effective_weight(module)
            if module.base_layer.bias is not None:
                out[f"{name}.bias"] = module.base_layer.bias.detach()
            merged.update(id(p) for p in module.parameters())
    for name, param in base.named_parameters():
        if id(param) not in merged:
            out[name] = param.detach()
    return out


def save_trained(policy: Policy, directory: str | os.PathLike[str]) -> Path:
    """Write `policy`'s trained weights into `directory` (created; files already
    there are replaced, others kept). The manifest is written last: a directory
    with `ponder.json` holds complete weights."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=".weights-"))
    try:
        if is_lora(policy.model):
            policy.model.save_pretrained(staging, save_embedding_layers=False)
            (staging / "README.md").unlink(missing_ok=True)  # PEFT's empty model card
        else:
            policy.model.save_pretrained(staging, safe_serialization=True)
            policy.tokenizer.save_pretrained(staging)
        for file in staging.iterdir():
            os.replace(file, directory / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    manifest = {
        "format": 1,
        "kind": "lora" if is_lora(policy.model) else "full",
        "base_model": policy.base or policy.name,
        "stack": [os.path.relpath(Path(p).resolve(), directory.resolve()) for p in policy.stack],
    }
    write_json_atomic(directory / MANIFEST, manifest)
    return directory


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        manifest["stack"] = [str((Path(directory) / p).resolve()) for p in manifest["stack"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ModelLoadError(f"{path}: unreadable ponder manifest ({err})") from err
    if manifest.get("kind") not in ("lora", "full") or not manifest.get("base_model"):
        raise ModelLoadError(f"{path}: manifest needs kind (lora or full) and base_model")
    return manifest


def find_trained(path: str | os.PathLike[str]) -> Path | None:
    """The directory with the final weights of a checkpoint, stage or run directory:
    the directory itself, the run's best validation weights (best/, kept by
    train.keep_best), its latest checkpoint, a demo's rl/ then sft/ stage, or a
    pipeline's last finished training stage. None when there is none."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    if (path / "best" / MANIFEST).is_file():
        return path / "best"
    pointer = path / "checkpoints" / "latest"
    if pointer.is_file():
        found = find_trained(pointer.parent / pointer.read_text().strip())
        if found is not None:
            return found
    for name in STAGE_DIRS:
        if (path / name).is_dir() and (found := find_trained(path / name)) is not None:
            return found
    stages = sorted(p for p in path.glob("[0-9][0-9]-*") if (p / "done.json").is_file() and (p / MANIFEST).is_file())
    return stages[-1] if stages else None


def require_trained(path: str | os.PathLike[str]) -> Path:
    found = find_trained(path)
    if found is None:
        raise ModelLoadError(
            f"{path}: neither a Hugging Face model directory (no config.json) nor a ponder run, stage or "
            f"checkpoint (no {MANIFEST}, checkpoints/latest, rl/, sft/ or finished pipeline stage)"
        )
    return found


def load_trained(path: str | os.PathLike[str], dtype: str = "float32", device: str = "auto") -> Policy:
    """A run's trained policy as a plain model: the base with the stack and the
    final adapter merged in (full fine-tunes load as they are)."""
    directory = require_trained(path)
    manifest = read_manifest(directory)
    if manifest["kind"] == "full":
        policy = load_policy(str(directory), dtype, device)
    else:
        policy = load_policy(manifest["base_model"], dtype, device)
        for adapter in [*manifest["stack"], str(directory)]:
            policy = merge_adapter(policy, adapter)
    return replace(policy, name=str(path), base=manifest["base_model"], stack=(*manifest["stack"], str(directory)))


def merge_adapter(policy: Policy, adapter_dir: str | os.PathLike[str]) -> Policy:
    """Load a PEFT adapter onto `policy` and fold it into the weights."""
    from peft import PeftModel

    if not (Path(adapter_dir) / ADAPTER_FILES[1]).is_file():
        raise ModelLoadError(f"{adapter_dir}: adapter missing ({ADAPTER_FILES[1]})")
    model = PeftModel.from_pretrained(policy.model, str(adapter_dir)).merge_and_unload()
    model.eval()
    return replace(policy, model=model)


def saved_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The tensors `save_trained` wrote: the adapter's (PEFT's names), or every weight
    of a full fine-tune."""
    from safetensors.torch import load_file

    directory = Path(directory)
    files = [directory / ADAPTER_FILES[1]] if (directory / ADAPTER_FILES[1]).is_file() else []
    files = files or sorted(directory.glob("model*.safetensors"))
    if not files:
        raise ValueError(f"{directory}: no saved weights ({ADAPTER_FILES[1]} or model*.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def load_adapter_weights(model: Any, directory: str | os.PathLike[str]) -> None:
    """Load weights saved by `save_trained` into a model of the same shape (resume):
    the adapters into a PEFT model, every weight into a fully fine-tuned one."""
    state = saved_weights(directory)
    if not is_lora(model):
        model.load_state_dict(state, strict=False)
        return
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    missing = set(get_peft_model_state_dict(model)) - set(state)
    if missing:
        raise ValueError(f"{directory}: adapter lacks weights {sorted(missing)[:3]} (different recipe?)")
    set_peft_model_state_dict(model, state)


def export_trained(path: str | os.PathLike[str], out: str | os.PathLike[str], merge: bool = False) -> Path:
    """Write a run's trained model to `out` (which must not exist or be empty): a
    standalone Hugging Face model directory with merge=True, else a PEFT adapter."""
    directory, out = require_trained(path), Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: exists and is not empty; choose a new --out")
    manifest = read_manifest(directory)
    staging = Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None, prefix=f".{out.name}-"))
    try:
        if merge or manifest["kind"] == "full":
            policy = load_trained(directory)
            policy.model.save_pretrained(staging, safe_serialization=True)
            policy.tokenizer.save_pretrained(staging)
        elif manifest["stack"]:
            raise ValueError(
                f"{path}: its adapter was trained on top of {len(manifest['stack'])} earlier adapter(s) "
                "(a pipeline stage); export it with --merge"
            )
        else:
            _copy_adapter(directory, staging, manifest["base_model"])
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _copy_adapter(directory: Path, target: Path, base_model: str) -> None:
    """The adapter files, with `base_model_name_or_path` pointing at a loadable base."""
    from ponder.models.loading import EMBEDDED_NAME, embedded_model_dir

    config = json.loads((directory / ADAPTER_FILES[0]).read_text())
    config["base_model_name_or_path"] = str(embedded_model_dir()) if base_model == EMBEDDED_NAME else base_model
    (target / ADAPTER_FILES[0]).write_text(json.dumps(config, indent=2) + "\n")
    shutil.copyfile(directory / ADAPTER_FILES[1], target / ADAPTER_FILES[1])


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """The weights training changes, as CPU tensors (PEFT's names for LoRA, every
    trainable parameter of a full fine-tune): what a sampler elsewhere (a Ray rollout
    worker) needs to catch up with the learner after an update."""
    if is_lora(model):
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model, save_embedding_layers=False)
    else:
        state = {name: p for name, p in model.named_parameters() if p.requires_grad}
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def load_trainable_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Load `trainable_state`'s tensors into a model of the same recipe."""
    if not is_lora(model):
        model.load_state_dict(state, strict=False)
        return
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, state)
