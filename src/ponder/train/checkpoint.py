"""Checkpoints: trained weights, optimizer, scheduler, RNG states, trainer state.

The weights are in the field's formats (models.adapters: a PEFT adapter, or a
Hugging Face model when fully fine-tuned), so every checkpoint directory loads with
`PeftModel.from_pretrained` or `ponder … --model CHECKPOINT_DIR`; the resume state
sits next to them as `.pt` files. Written to a temp directory and renamed into
place, then `latest` is updated atomically, so a SIGKILL at any moment leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ponder.fileio import write_json_atomic, write_text_atomic
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
    _seal(staging)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    write_text_atomic(root / "latest", final.name + "\n")
    for old in sorted(root.glob("step-*"))[:-KEEP_LAST]:
        shutil.rmtree(old, ignore_errors=True)
    return final


CHECKSUMS = "checksums.json"
STEP_NAME = re.compile(r"step-\d{6}")
# What _seal records: plain names of files in the checkpoint directory.
FILE_NAME = re.compile(r"[\w-][\w.-]*")


def _seal(directory: Path) -> None:
    """fsync every file of a checkpoint and record its sha256 in checksums.json."""
    sums = {}
    for file in sorted(p for p in directory.iterdir() if p.is_file()):
        with open(file, "rb") as handle:
            sums[file.name] = hashlib.sha256(handle.read()).hexdigest()
            os.fsync(handle.fileno())
    write_json_atomic(directory / CHECKSUMS, sums)


def damage(path: Path) -> str | None:
    """Why checkpoint `path` cannot be trusted (missing, a file missing or changed), or None."""
    if not path.is_dir():
        return "missing"
    try:
        sums = json.loads((path / CHECKSUMS).read_text())
    except FileNotFoundError:
        return f"{CHECKSUMS} missing"  # every checkpoint ponder writes is sealed with one
    except (OSError, ValueError) as err:
        return f"{CHECKSUMS} unreadable ({err})"
    if not isinstance(sums, dict) or not all(isinstance(digest, str) for digest in sums.values()):
        return f"{CHECKSUMS} is not a mapping of file names to sha256 digests"
    for name, expected in sums.items():
        if not FILE_NAME.fullmatch(name):  # damaged: it would name a path outside, or break the warning line
            return f"{CHECKSUMS} lists {name!r}, not a file name"
        file = path / name
        if not file.is_file():
            return f"{name} missing"
        if hashlib.sha256(file.read_bytes()).hexdigest() != expected:
            return f"{name} does not match its checksum"
    # _seal lists every file, so one it does not list was added or renamed since (or
    # checksums.json itself was rewritten, e.g. to {}): nothing vouches for its bytes.
    unsealed = sorted({p.name for p in path.iterdir() if p.is_file()} - set(sums) - {CHECKSUMS})
    if unsealed:
        return f"{unsealed[0]!r} is not in {CHECKSUMS}"
    return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest intact checkpoint of run_dir: the one `latest` names when it is
    intact and inside the run, else the newest older one that verifies (with a
    one-line warning on stderr naming what was wrong). None when there is none."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    candidates = sorted((p for p in root.glob("step-*") if STEP_NAME.fullmatch(p.name)), reverse=True)
    if not pointer.is_file() and not candidates:
        return None
    named = _read_pointer(pointer)
    if STEP_NAME.fullmatch(named):
        candidates = [root / named] + [p for p in candidates if p.name != named]
    problem = None if STEP_NAME.fullmatch(named) else (
        f"'latest' names {named!r}, not a checkpoint of this run" if pointer.is_file() else "'latest' is missing")
    for path in candidates:
        why = damage(path)
        if why is None:
            if problem is not None:
                print(f"ponder: warning: {problem}; resuming from {path.name}", file=sys.stderr)
            return path
        problem = problem or f"checkpoint {path.name}: {why}"
    if problem is not None:
        print(f"ponder: warning: {problem}; no intact checkpoint left", file=sys.stderr)
    return None


def _read_pointer(pointer: Path) -> str:
    try:
        return pointer.read_text(errors="replace").strip()
    except OSError:
        return ""


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


class Resumable(ABC):
    """save() / resume() for a supervised trainer holding run_dir, step, policy,
    optimizer and scheduler: it gives its own state with `trainer_state()` (a dict with
    "step") and takes it back with `load_trainer_state(state)`."""

    @abstractmethod
    def trainer_state(self) -> dict[str, Any]:
        """The trainer's own state to checkpoint (with "step")."""

    @abstractmethod
    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """Take back what trainer_state() gave (the step is already restored)."""

    def save(self) -> Path:
        return save_training_state(self.run_dir, self.step, self.policy, self.optimizer, self.scheduler,
                                   self.trainer_state())  # fmt: skip

    def resume(self) -> int:
        """Restore the latest checkpoint of run_dir; returns its step (0 when none)."""
        state = restore_training_state(self.run_dir, self.policy.model, self.optimizer, self.scheduler)
        if state is None:
            return 0
        self.step = state["step"]
        self.load_trainer_state(state)
        return self.step
