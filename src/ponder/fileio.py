"""Atomic file writes and strict JSON: readers see the old file or the whole new
one, never half, and every JSON file parses with any standard JSON reader.

A leaf module (standard library only) so that even `types.py` may use it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temp path next to `path`; on success rename it over `path`.

    On any exception the temp file is removed and `path` is left untouched. The
    file gets the usual umask-derived mode (mkstemp alone would make it 0600).
    The temp file is fsynced before the rename: without it a power cut can leave
    the new name pointing at a file whose data never reached the disk (empty).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        fsync_path(tmp)
        os.replace(tmp, target)
        # Makes the rename itself durable; some file systems refuse to open or
        # fsync a directory, and the file's data is safe either way.
        with contextlib.suppress(OSError):
            fsync_path(target.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A staging directory beside `path` (which must not exist or be empty) that becomes
    `path` when the block ends without an error, and is removed when it raises: a
    reader never sees half a directory."""
    import shutil

    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: exists and is not empty; choose a new --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        yield staging
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory (a directory: so a rename into it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def finite_json(value: Any) -> Any:
    """`value` with every NaN and ±inf replaced by None, recursively through dicts,
    lists and tuples; numpy / torch scalars and arrays become Python numbers and
    lists. Standard JSON has no NaN: json.dumps would write the bare token `NaN`,
    which JSON.parse, jq and most other readers reject."""
    if isinstance(value, float):  # numpy.float64 is a float too
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy / torch, without importing them
        return finite_json(value.tolist())
    return value


def dumps_strict(value: Any, *, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    """json.dumps that never writes NaN or Infinity: non-finite floats become null
    (see finite_json), also those `default` returns. Other json.dumps keyword
    arguments (indent, sort_keys, ensure_ascii) pass through."""
    wrapped = None if default is None else (lambda obj: finite_json(default(obj)))
    return json.dumps(finite_json(value), allow_nan=False, default=wrapped, **kwargs)


def write_json_atomic(
    path: str | os.PathLike[str],
    value: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """Write `value` as strict JSON (dumps_strict) with a trailing newline, atomically."""
    write_text_atomic(path, dumps_strict(value, indent=indent, sort_keys=sort_keys, default=default) + "\n")


def read_jsonl(path: str | os.PathLike[str], error: type[ValueError], what: str) -> Iterator[tuple[str, Any]]:
    """("file:line", the decoded value) for every non-blank line of a JSON Lines file,
    streamed. A file that cannot be read, or a line that is not UTF-8 or not JSON,
    raises `error` with one line naming the file (and line). Lines split on "\\n" only
    (str.splitlines would also split inside a JSON string holding U+2028 or \\x1c)."""
    source = os.fspath(path)
    try:
        handle = open(source, "rb")
    except OSError as err:
        raise error(f"{source}: cannot read {what} ({err.strerror or err})") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                where = f"{source}:{number}"
                yield where, _json_line(raw, where, error)


def _json_line(raw: bytes, where: str, error: type[ValueError]) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise error(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise error(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as err:  # an integer past Python's digit limit
        raise error(f"{where}: not valid JSON ({str(err).split(':')[0]})") from None
