"""Per-user adapters and the feedback they learn from, in one directory.

```
root/store.sqlite                    metadata (SQLite, WAL): adapters, current, interactions, feedback
root/adapters/<user>/v<N>-<random>/  adapter_config.json + adapter_model.safetensors (PEFT's layout)
root/tmp/                            staging of writes in progress
```

A new version is written so that a kill at any moment leaves the previous one
current and loadable: its files are copied into tmp/, fsynced, the directory is
renamed into adapters/<user>/ and that directory fsynced; only then are its row and
the user's `current` pointer written, in one transaction. A directory without a row
(an interrupted write) is never read and `gc()` removes it; a row always points at
complete, durable files. Versions are kept; `rollback` moves the pointer back.

Each adapter row carries the hash of the base weights it was trained on
(models/base_hash.py); `adapter_path(..., base_hash=)` refuses an adapter for
another base.

User names arrive in HTTP requests, so they are untrusted: 1-64 characters from
[A-Za-z0-9._-], not `.` or `..`, checked before any path is built from one.

Standard library only (the hash is computed by the caller): `ponder personal list`
and the crash tests' writer process start without importing torch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ponder.fileio import fsync_path

# The files of PEFT's adapter layout (models/adapters.py has the same constant; it
# is repeated here because that module imports torch).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
FEEDBACK_KINDS = ("up", "down", "rewrite", "correction", "outcome")
PAUSE_ENV = "PONDER_STORE_PAUSE_AT"
_USER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS adapters (
    user TEXT NOT NULL, version INTEGER NOT NULL, base_hash TEXT NOT NULL, created REAL NOT NULL,
    steps INTEGER NOT NULL, feedback INTEGER NOT NULL, pairs INTEGER NOT NULL, path TEXT NOT NULL,
    parent_version INTEGER, PRIMARY KEY (user, version));
CREATE TABLE IF NOT EXISTS current (user TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS interactions (
    id TEXT PRIMARY KEY, user TEXT NOT NULL, created REAL NOT NULL, messages TEXT NOT NULL,
    response TEXT NOT NULL, adapter_version INTEGER);
CREATE INDEX IF NOT EXISTS interactions_user ON interactions (user);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT, interaction_id TEXT NOT NULL REFERENCES interactions (id),
    user TEXT NOT NULL, created REAL NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('up', 'down', 'rewrite', 'correction', 'outcome')),
    value REAL, text TEXT);
CREATE INDEX IF NOT EXISTS feedback_user ON feedback (user);
"""


class NotFound(ValueError):
    """An interaction, user version or adapter the store does not hold (the server: 404)."""


@dataclass(frozen=True)
class AdapterVersion:
    """One saved adapter of a user. steps: DPO steps behind it, its parents' included;
    feedback / pairs: feedback rows and preference pairs its last update learnt from;
    path: its directory; parent_version: the version it continued (None: fresh LoRA)."""

    user: str
    version: int
    base_hash: str
    created: float
    steps: int
    feedback: int
    pairs: int
    path: Path
    parent_version: int | None


@dataclass(frozen=True)
class Interaction:
    """A served chat: the rendered prompt messages and the text the model wrote."""

    id: str
    user: str
    created: float
    messages: list[dict[str, Any]]
    response: str
    adapter_version: int | None


@dataclass(frozen=True)
class Feedback:
    """One judgement of an interaction. kind up / down: value +1 / -1; rewrite and
    correction: text (what the answer should have been); outcome: value (a task's
    score, >= 0.5 counts as success)."""

    id: int
    interaction_id: str
    user: str
    created: float
    kind: str
    value: float | None
    text: str | None


def check_user(user: Any) -> str:
    """`user` when it is a safe name (see module docstring), else a one-line ValueError."""
    if not isinstance(user, str) or not _USER.match(user) or user in (".", ".."):
        raise ValueError(f"user name {str(user)[:80]!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return user


def _pause(stage: str) -> None:
    """Crash tests name a stage of a write in PONDER_STORE_PAUSE_AT: the writer announces
    it on stderr and sleeps there, so the test can SIGKILL it between any two steps."""
    if os.environ.get(PAUSE_ENV) == stage:
        print(f"store: paused at {stage}", file=sys.stderr, flush=True)
        time.sleep(600)



class AdapterStore:
    """The store in `root` (created when missing); see the module docstring. Every method
    opens its own SQLite connection, so one store may be used from several threads and
    several processes at once."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()
        (self.root / "adapters").mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        self.db_path = self.root / "store.sqlite"
        with contextlib.closing(sqlite3.connect(self.db_path, timeout=30)) as conn:
            # WAL: readers (the server answering chats) never wait for a writer.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection; with write=True one transaction (BEGIN IMMEDIATE … COMMIT, rolled
        back on any error, so a change is all or nothing)."""
        conn = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        try:
            # NORMAL in WAL mode: a killed process loses no commit; a power cut may lose the
            # last ones but never corrupts, and adapter files are durable before their row.
            conn.execute("PRAGMA synchronous=NORMAL")
            if write:
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            if write:
                conn.execute("COMMIT")
        except BaseException:
            if write and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    # --- adapters --------------------------------------------------------------------

    def save_version(
        self, user: str, adapter_dir: str | os.PathLike[str], base_hash: str, steps: int = 0,
        feedback: int = 0, pairs: int = 0, parent_version: int | None = None,
    ) -> int:  # fmt: skip
        """Copy the PEFT adapter in `adapter_dir` in as the user's next version and make it
        current (crash-safe, see module docstring); returns the new version number."""
        check_user(user)
        source = Path(adapter_dir)
        missing = [name for name in ADAPTER_FILES if not (source / name).is_file()]
        if missing:
            raise ValueError(f"{source}: not a PEFT adapter directory (missing {', '.join(missing)})")
        if not base_hash:
            raise ValueError("save_version needs the base model's hash")
        staging = Path(tempfile.mkdtemp(dir=self.root / "tmp", prefix=f"{user}-"))
        final = None
        try:
            _pause("staging")
            for name in ADAPTER_FILES:
                shutil.copyfile(source / name, staging / name)
                fsync_path(staging / name)
                _pause(f"copied {name}")
            fsync_path(staging)
            user_dir = self._user_dir(user)
            final = user_dir / f"v{self._next_version(user)}-{secrets.token_hex(4)}"
            os.rename(staging, final)
            fsync_path(user_dir)
            _pause("renamed")
            record = (base_hash, time.time(), steps, feedback, pairs, parent_version)
            version = self._commit_version(user, final, record)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if final is not None:  # renamed but never recorded: nothing points at it
                shutil.rmtree(final, ignore_errors=True)
            raise
        _pause("committed")
        return version

    def _user_dir(self, user: str) -> Path:
        user_dir = self.root / "adapters" / check_user(user)
        if not user_dir.is_dir():
            user_dir.mkdir()
            fsync_path(user_dir.parent)
        return user_dir

    def _next_version(self, user: str) -> int:
        with self._connect() as conn:
            (top,) = conn.execute("SELECT MAX(version) FROM adapters WHERE user = ?", (user,)).fetchone()
        return (top or 0) + 1

    def _commit_version(self, user: str, directory: Path, record: tuple) -> int:
        """The row and the current pointer, in one transaction. The version is taken inside
        it, so two writers for one user cannot get the same number."""
        with self._connect(write=True) as conn:
            (top,) = conn.execute("SELECT MAX(version) FROM adapters WHERE user = ?", (user,)).fetchone()
            version = (top or 0) + 1
            if not directory.name.startswith(f"v{version}-"):  # another writer took the number
                renamed = directory.with_name(f"v{version}-{directory.name.split('-', 1)[1]}")
                os.rename(directory, renamed)
                fsync_path(directory.parent)
                directory = renamed
            conn.execute("INSERT INTO adapters VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (user, version, *record[:5], str(directory.relative_to(self.root)), record[5]))
            conn.execute("INSERT OR REPLACE INTO current VALUES (?, ?)", (user, version))
            _pause("inserted")
        return version

    def _row(self, row: tuple) -> AdapterVersion:
        user, version, base_hash, created, steps, feedback, pairs, path, parent = row
        return AdapterVersion(user, version, base_hash, created, steps, feedback, pairs, self.root / path, parent)

    def current(self, user: str) -> AdapterVersion | None:
        """The user's current adapter (None: the user has none; the base answers)."""
        check_user(user)
        with self._connect() as conn:
            row = conn.execute("SELECT a.* FROM adapters a JOIN current c ON a.user = c.user AND "
                               "a.version = c.version WHERE c.user = ?", (user,)).fetchone()  # fmt: skip
        return self._row(row) if row else None

    def versions(self, user: str) -> list[AdapterVersion]:
        check_user(user)
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM adapters WHERE user = ? ORDER BY version", (user,)).fetchall()
        return [self._row(row) for row in rows]

    def version(self, user: str, version: int) -> AdapterVersion:
        check_user(user)
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM adapters WHERE user = ? AND version = ?", (user, version)).fetchone()
        if row is None:
            have = ", ".join(str(v.version) for v in self.versions(user)) or "none"
            raise NotFound(f"user {user} has no adapter version {version} (versions: {have})")
        return self._row(row)

    def rollback(self, user: str, version: int) -> AdapterVersion:
        """Make an earlier (or any saved) version the user's current one."""
        found = self.version(user, version)
        with self._connect(write=True) as conn:
            conn.execute("INSERT OR REPLACE INTO current VALUES (?, ?)", (user, version))
        return found

    def adapter_path(self, user: str, version: int | None = None, base_hash: str | None = None) -> Path:
        """The directory of a version (default: the current one). With `base_hash`, a
        one-line ValueError when the adapter was trained on another base."""
        found = self.version(user, version) if version is not None else self.current(user)
        if found is None:
            raise NotFound(f"user {user} has no adapter yet")
        if base_hash is not None and found.base_hash != base_hash:
            raise ValueError(f"user {user} v{found.version} was trained on base {found.base_hash[:12]}…, "
                             f"this model is {base_hash[:12]}…")  # fmt: skip
        missing = [name for name in ADAPTER_FILES if not (found.path / name).is_file()]
        if missing:
            raise ValueError(f"user {user} v{found.version}: {found.path} lacks {', '.join(missing)}")
        return found.path

    def users(self) -> list[str]:
        """Every user with an adapter or a logged interaction, sorted."""
        with self._connect() as conn:
            rows = conn.execute("SELECT user FROM adapters UNION SELECT user FROM interactions").fetchall()
        return sorted(user for (user,) in rows)

    def gc(self, min_age_s: float = 3600.0) -> list[Path]:
        """Remove what no row points at: staging left by killed writes and adapter
        directories never recorded. Only entries older than `min_age_s`, so a write in
        progress in another process is left alone. Returns what was removed."""
        with self._connect() as conn:
            kept = {self.root / path for (path,) in conn.execute("SELECT path FROM adapters")}
        candidates = list((self.root / "tmp").iterdir())
        for user_dir in (self.root / "adapters").iterdir():
            if user_dir.is_dir() and _USER.match(user_dir.name):
                candidates += [entry for entry in user_dir.iterdir() if entry not in kept]
        removed = []
        for entry in candidates:
            if time.time() - entry.lstat().st_mtime < min_age_s:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        return removed

    # --- interactions and feedback -----------------------------------------------------

    def log_interaction(
        self, user: str, messages: list[dict[str, Any]], response: str, adapter_version: int | None = None,
        interaction_id: str | None = None,
    ) -> str:  # fmt: skip
        """Record a served chat (its prompt messages and the model's text); returns its id."""
        check_user(user)
        interaction_id = interaction_id or f"int-{uuid.uuid4().hex}"
        if not 0 < len(interaction_id) <= 128:
            raise ValueError("an interaction id is 1-128 characters")
        with self._connect(write=True) as conn:
            conn.execute("INSERT INTO interactions VALUES (?, ?, ?, ?, ?, ?)",
                         (interaction_id, user, time.time(), json.dumps(messages, ensure_ascii=False),
                          response, adapter_version))  # fmt: skip
        return interaction_id

    def interaction(self, interaction_id: str) -> Interaction:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM interactions WHERE id = ?", (interaction_id,)).fetchone()
        if row is None:
            raise NotFound(f"no interaction {str(interaction_id)[:140]!r} (feedback names a chat completion's id)")
        return _interaction(row)

    def add_feedback(
        self, interaction_id: str, kind: str, value: float | None = None, text: str | None = None
    ) -> int:
        """Record feedback on an interaction (see Feedback); returns its id. ValueError for
        an unknown kind or a missing / malformed value or text, NotFound for an unknown
        interaction."""
        value, text = _checked_feedback(kind, value, text)
        user = self.interaction(interaction_id).user
        with self._connect(write=True) as conn:
            cursor = conn.execute("INSERT INTO feedback (interaction_id, user, created, kind, value, text) "
                                  "VALUES (?, ?, ?, ?, ?, ?)",
                                  (interaction_id, user, time.time(), kind, value, text))  # fmt: skip
            return int(cursor.lastrowid)

    def feedback_for(self, user: str) -> tuple[list[Interaction], list[Feedback]]:
        """The user's feedback rows (oldest first) and the interactions they judge."""
        check_user(user)
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM feedback WHERE user = ? ORDER BY id", (user,)).fetchall()
            judged = conn.execute("SELECT * FROM interactions WHERE id IN (SELECT interaction_id FROM feedback "
                                  "WHERE user = ?) ORDER BY created, id", (user,)).fetchall()  # fmt: skip
        return [_interaction(row) for row in judged], [Feedback(*row) for row in rows]

    def counts(self, user: str) -> dict[str, int]:
        """Interactions and feedback of each kind the user has."""
        check_user(user)
        with self._connect() as conn:
            (logged,) = conn.execute("SELECT COUNT(*) FROM interactions WHERE user = ?", (user,)).fetchone()
            kinds = dict(conn.execute("SELECT kind, COUNT(*) FROM feedback WHERE user = ? GROUP BY kind", (user,)))
        return {"interactions": logged, **{kind: kinds.get(kind, 0) for kind in FEEDBACK_KINDS}}


def _interaction(row: tuple) -> Interaction:
    interaction_id, user, created, messages, response, adapter_version = row
    return Interaction(interaction_id, user, created, json.loads(messages), response, adapter_version)


def _checked_feedback(kind: str, value: Any, text: Any) -> tuple[float | None, str | None]:
    """(value, text) as stored for `kind`, or a one-line ValueError."""
    if kind not in FEEDBACK_KINDS:
        raise ValueError(f"feedback kind {str(kind)[:40]!r}: use one of {', '.join(FEEDBACK_KINDS)}")
    if kind in ("up", "down"):
        return (1.0 if kind == "up" else -1.0), None
    if kind == "outcome":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError("outcome feedback needs a finite number (>= 0.5 counts as success)")
        return float(value), None
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{kind} feedback needs the text the answer should have been")
    return None, text
