"""Checkpoints: trainable weights, optimizer, scheduler, RNG states, trainer state.

Written to a temp directory and renamed into place, then `latest` is updated
atomically, so a SIGKILL at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ponder.fileio import write_text_atomic

KEEP_LAST = 2


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Only parameters that train (the LoRA adapters, or everything when fully fine-tuned)."""
    return {name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad}


def save_checkpoint(run_dir: Path, step: int, objects: dict[str, Any]) -> Path:
    """Save `objects` (name → state) as checkpoints/step-N and point `latest` at it."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    staging = root / f".step-{step:06d}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
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


def save_training_state(run_dir: Path, step: int, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                        trainer: dict[str, Any]) -> Path:
    """A supervised trainer's checkpoint: trainable weights, optimizer, scheduler and
    the trainer's own state (step, data order, RNG …)."""
    objects = {"weights": trainable_state(model), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "trainer": trainer}  # fmt: skip
    return save_checkpoint(run_dir, step, objects)


def restore_training_state(
    run_dir: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any
) -> dict[str, Any] | None:
    """Load the latest checkpoint of `save_training_state` into model, optimizer and
    scheduler; returns the trainer state, or None when run_dir has no checkpoint."""
    path = latest_checkpoint(run_dir)
    if path is None:
        return None
    state = load_checkpoint(path)
    model.load_state_dict(state["weights"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["trainer"]
