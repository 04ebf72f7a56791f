"""Where a Tinker checkpoint lives: `tinker://MODEL_ID/weights/NAME` (save_state: the
adapter and the optimizer's state) and `tinker://MODEL_ID/sampler_weights/NAME`
(save_weights_for_sampler: the adapter alone), each a directory under the server's
state directory, `runs/MODEL_ID/{weights,sampler_weights}/NAME/`, in ponder's adapter
format (PEFT's files + ponder.json) plus tinker.json. They outlive the server: a
later server with the same --state-dir loads and samples them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SCHEME = "tinker://"
KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,199}")


@dataclass(frozen=True)
class CheckpointPath:
    """A parsed tinker path."""

    model_id: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"


def check_name(name: str) -> str:
    """A checkpoint name as one safe path component, or ValueError saying what is allowed."""
    if not _NAME.fullmatch(name or ""):
        raise ValueError(f"checkpoint name {name!r}: use 1-200 letters, digits, '.', '_' or '-', starting with "
                         "a letter or digit")  # fmt: skip
    return name


def parse(path: str) -> CheckpointPath:
    """`tinker://MODEL_ID/KIND/NAME` parsed, or ValueError naming what is wrong."""
    if not path.startswith(SCHEME):
        raise ValueError(f"{path!r} is not a tinker path (tinker://MODEL_ID/weights/NAME or .../sampler_weights/NAME)")
    parts = path[len(SCHEME) :].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not _MODEL_ID.fullmatch(parts[0]):
        raise ValueError(f"{path!r} is not a tinker path (tinker://MODEL_ID/weights/NAME or .../sampler_weights/NAME)")
    return CheckpointPath(parts[0], parts[1], check_name(parts[2]))


class CheckpointStore:
    """The checkpoints under one state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def directory(self, path: CheckpointPath) -> Path:
        return self.root / "runs" / path.model_id / path.kind / path.name

    def existing(self, path: str, kind: str | None = None) -> tuple[CheckpointPath, Path]:
        """The parsed path and its directory; LookupError when nothing was saved there."""
        parsed = parse(path)
        if kind is not None and parsed.kind != kind:
            wanted = "save_state" if kind == "weights" else "save_weights_for_sampler"
            raise ValueError(f"{path}: expected a {kind} path (from {wanted}), got {parsed.kind}")
        directory = self.directory(parsed)
        if not (directory / "tinker.json").is_file():
            raise LookupError(f"no checkpoint at {path} on this server")
        return parsed, directory
