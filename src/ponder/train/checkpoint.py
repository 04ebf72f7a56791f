"""Checkpoints: trained weights, optimizer, scheduler, RNG states, trainer state.

The weights are in the field's formats (models.adapters: a PEFT adapter, or a
Hugging Face model when fully fine-tuned), so every checkpoint directory loads with
`PeftModel.from_pretrained` or `ponder … --model CHECKPOINT_DIR`; the resume state
sits next to them as `.pt` files. Written to a temp directory and renamed into
place, then `latest` is updated atomically, so a SIGKILL at any moment leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ponder.fileio import write_text_atomic
from ponder.models import Policy
from ponder.models.adapters import load_adapter_weights, save_trained

KEEP_LAST = 2


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: Path, step: int, policy: Policy, objects: dict[str, Any]) -> Path:
    """Save the policy's trained weights and `objects` (name → state) as
    checkpoints/step-N and point `latest` at it."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    staging = root / f".step-{step:06d}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_trained(policy, staging)
    for name, state in objects.items():
        torch.save(state, staging / f"{name}.pt")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    write_text_atomic(root / "latest", final.name + "\n")
    for old in sorted(root.glob("step-*"))[:-KEEP_LAST]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    # weights_only=False: RNG states hold numpy arrays and python tuples we wrote ourselves.
    return {file.stem: torch.load(file, weights_only=False) for file in sorted(Path(path).glob("*.pt"))}


def save_training_state(run_dir: Path, step: int, policy: Policy, optimizer: Any, scheduler: Any,
                        trainer: dict[str, Any]) -> Path:
    """A supervised trainer's checkpoint: trained weights, optimizer, scheduler and
    the trainer's own state (step, data order, RNG …)."""
    objects = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "trainer": trainer}
    return save_checkpoint(run_dir, step, policy, objects)


def restore_training_state(
    run_dir: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any
) -> dict[str, Any] | None:
    """Load the latest checkpoint of `save_training_state` into model, optimizer and
    scheduler; returns the trainer state, or None when run_dir has no checkpoint."""
    path = latest_checkpoint(run_dir)
    if path is None:
        return None
    state = load_checkpoint(path)
    load_adapter_weights(model, path)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["trainer"]
