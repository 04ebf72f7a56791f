"""Per-user adapters in `ponder serve --users DIR` (the hf backend).

A chat with OpenAI's `user` field and the base model's name is answered with that
user's current adapter from the store (personal/store.py; the base when the user has
none) and logged as an interaction whose id is the completion's id. Feedback on it
(POST /v1/feedback) goes to the store; POST /v1/users/{user}/update trains the user's
next version on a worker thread, on a policy loaded for it (never the serving model),
and then swaps the served adapter without a restart.

How a swap stays safe: jobs name a user's adapter by an alias (`@alice`) that the
batcher resolves when a batch starts (AdapterBackend.aliases). A swap loads the new
version under its own PEFT name (`user:alice@v2`), points the alias at it and unloads
the old one, all under the batcher's lock, so it happens between two batches: a batch
in flight finishes on the old version, the next one uses the new. Served versions are
checked against the store's current one on every request, so a rollback or an update
made by `ponder personal` in another process is picked up too.

Every method blocks (SQLite, PEFT loads); the HTTP layer calls them in a thread.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ponder.models.loading import Policy
from ponder.personal.config import PersonalConfig
from ponder.personal.feedback import preference_pairs
from ponder.personal.learn import describe_report, update_user
from ponder.personal.store import AdapterStore, NotFound, check_user
from ponder.serve.adapters import AdapterBackend
from ponder.serve.errors import APIError, bad_request

FEEDBACK_FIELDS = ("rating", "rewrite", "correction", "outcome")
logger = logging.getLogger(__name__)


def user_alias(user: str) -> str:
    # '@' is not allowed in --adapter names, so an alias never shadows one.
    return f"@{user}"


def peft_name(user: str, version: int) -> str:
    # PEFT keeps adapters in module dicts, whose keys may not hold '.'; ':' is never in a user name.
    return f"user:{user.replace('.', ':')}@v{version}"


@dataclass
class UpdateJob:
    """One update of a user's adapter: queued -> running -> done (served) | failed."""

    user: str
    settings: PersonalConfig
    id: str = field(default_factory=lambda: "upd-" + uuid.uuid4().hex[:16])
    status: str = "queued"
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    version: int | None = None
    error: str | None = None
    metrics: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        fields = {k: v for k, v in asdict(self).items() if k != "settings"}
        return {"object": "user.update", **fields, "settings": asdict(self.settings)}


def _user(user: str) -> str:
    try:
        return check_user(user)
    except ValueError as err:
        raise bad_request(str(err), param="user", code="invalid_user") from None


class UserAdapters:
    """The store, the adapters served from it, and the update worker (see module docstring).

    backend / lock: the serving backend and the batcher's lock. load_base: loads a fresh
    copy of the base for an update. base_hash: the serving base's hash; adapters trained
    on another base are refused (409)."""

    def __init__(self, store: AdapterStore, backend: AdapterBackend, lock: threading.Lock,
                 load_base: Callable[[], Policy], personal: PersonalConfig, base_hash: str) -> None:  # fmt: skip
        self.store, self.backend, self.lock = store, backend, lock
        self.load_base, self.personal, self.base_hash = load_base, personal, base_hash
        self.served: dict[str, int] = {}  # user -> version loaded under the user's alias
        self.versions: dict[str, tuple[str, int]] = {}  # PEFT name -> (user, version)
        self.jobs: dict[str, UpdateJob] = {}  # user -> latest update
        self._swap_lock = threading.Lock()
        self._queue: queue.Queue[UpdateJob | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="ponder-serve-updates", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        """No further updates; one in progress ends with the process (its thread is a daemon)."""
        self._queue.put(None)

    # --- serving -----------------------------------------------------------------------

    def route(self, user: str) -> str | None:
        """The adapter name a user's job carries (None: the base), the store's current
        version loaded first when it is not the one served."""
        current = self.store.current(_user(user))
        if current is None:
            return None
        if self.served.get(user) != current.version:
            self.swap(user, current.version)
        return user_alias(user)

    def swap(self, user: str, version: int) -> None:
        """Serve `version` for `user` from the next batch on (see module docstring)."""
        with self._swap_lock:
            if self.served.get(user) == version:
                return
            found = self.store.version(user, version)
            if found.base_hash != self.base_hash:
                raise APIError(409, f"user {user} v{version} was trained on base {found.base_hash[:12]}…, this model "
                                    f"is {self.base_hash[:12]}…; roll the user back to a version of this base",
                               "adapter_base_mismatch")  # fmt: skip
            path = self.store.adapter_path(user, version, base_hash=self.base_hash)
            name, old = peft_name(user, version), self.served.get(user)
            with self.lock:
                self.backend.add_adapter(name, path)
                self.backend.aliases[user_alias(user)] = name
                if old is not None:
                    self.backend.remove_adapter(peft_name(user, old))
            self.served[user] = version
            self.versions[name] = (user, version)

    def log(self, user: str, messages: list[dict[str, Any]], response: str, adapter: str | None,
            interaction_id: str) -> None:  # fmt: skip
        """Record a served chat; `adapter` is the PEFT adapter that answered (JobResult.adapter)."""
        version = self.versions.get(adapter, (user, None))[1] if adapter else None
        self.store.log_interaction(user, messages, response, version, interaction_id)

    # --- feedback, updates, rollback ---------------------------------------------------

    def feedback(self, body: Any) -> dict[str, Any]:
        """POST /v1/feedback: {id, and one of rating (1 | -1), rewrite, correction, outcome}."""
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise bad_request("feedback needs the chat completion's `id` (a string)", param="id")
        given = [name for name in FEEDBACK_FIELDS if body.get(name) is not None]
        if len(given) != 1:
            raise bad_request(f"feedback takes exactly one of {', '.join(FEEDBACK_FIELDS)}; got "
                              f"{', '.join(given) or 'none'}", param="rating")  # fmt: skip
        kind, value = given[0], body[given[0]]
        if kind == "rating":
            if value not in (1, -1) or isinstance(value, bool):
                raise bad_request("rating is 1 (thumbs up) or -1 (thumbs down)", param="rating")
            kind = "up" if value == 1 else "down"
        if kind == "outcome" and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not math.isfinite(value)):  # fmt: skip
            raise bad_request("outcome is a number (>= 0.5 counts as success)", param="outcome")
        text = value if kind in ("rewrite", "correction") else None
        try:
            feedback_id = self.store.add_feedback(body["id"], kind, value if kind == "outcome" else None, text)
        except NotFound as err:
            raise APIError(404, str(err), "interaction_not_found", param="id") from None
        except ValueError as err:
            raise bad_request(str(err), param=given[0]) from None
        user = self.store.interaction(body["id"]).user
        return {"object": "feedback", "id": feedback_id, "interaction": body["id"], "user": user, "kind": kind}

    def update(self, user: str, overrides: Any) -> dict[str, Any]:
        """POST /v1/users/{user}/update: queue an update (409 while one is queued or
        running, 400 with too little feedback); the job's body."""
        _user(user)
        if not isinstance(overrides, dict):
            raise bad_request("the update body is a JSON object of settings (steps, lr, beta …)")
        try:
            settings = self.personal.with_overrides(overrides)
        except (TypeError, ValueError) as err:
            raise bad_request(str(err).splitlines()[0]) from None
        interactions, rows = self.store.feedback_for(user)
        pairs, report = preference_pairs(interactions, rows)
        if len(pairs) < settings.min_pairs:
            raise bad_request(f"user {user} has {len(pairs)} preference pair(s) from {len(rows)} feedback row(s) "
                              f"({describe_report(report)}); an update needs at least {settings.min_pairs}",
                              code="not_enough_feedback")  # fmt: skip
        with self._swap_lock:
            last = self.jobs.get(user)
            if last is not None and last.status in ("queued", "running"):
                raise APIError(409, f"user {user} already has an update {last.status} ({last.id})",
                               "update_in_progress")  # fmt: skip
            job = self.jobs[user] = UpdateJob(user, settings)
        self._queue.put(job)
        return job.body()

    def _work(self) -> None:
        """The update worker: one update at a time (training competes with serving for the CPU)."""
        while (job := self._queue.get()) is not None:
            job.status, job.started = "running", time.time()
            try:
                job.version, job.metrics = update_user(self.store, job.user, self.load_base, job.settings)
                self.swap(job.user, job.version)
                status = "done"
            except Exception as err:  # the job reports it; the server goes on serving
                logger.warning("update of user %s failed", job.user, exc_info=True)
                first = str(err).splitlines()[0] if str(err) else ""
                status, job.error = "failed", f"{type(err).__name__}: {first}"
            job.finished = time.time()
            job.status = status  # last: a client that sees done or failed sees the rest too

    def rollback(self, user: str, version: Any) -> dict[str, Any]:
        """POST /v1/users/{user}/rollback {version}: make it current and serve it."""
        _user(user)
        if not isinstance(version, int) or isinstance(version, bool):
            raise bad_request("rollback needs {\"version\": N}", param="version")
        try:
            self.store.rollback(user, version)
        except NotFound as err:
            raise APIError(404, str(err), "version_not_found", param="version") from None
        self.swap(user, version)
        return self.info(user)

    def info(self, user: str) -> dict[str, Any]:
        """GET /v1/users/{user}: versions, current and served version, counts, the last update."""
        current = self.store.current(_user(user))
        versions = [{"version": v.version, "created": v.created, "steps": v.steps, "feedback": v.feedback,
                     "pairs": v.pairs, "parent_version": v.parent_version, "base_hash": v.base_hash,
                     "this_base": v.base_hash == self.base_hash} for v in self.store.versions(user)]  # fmt: skip
        job = self.jobs.get(user)
        return {"object": "user", "user": user, "current": current.version if current else None,
                "served": self.served.get(user), "versions": versions, "counts": self.store.counts(user),
                "update": job.body() if job else None}  # fmt: skip
