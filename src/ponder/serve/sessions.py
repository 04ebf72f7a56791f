"""Sessions of the training gateway: one agent episode's model calls, recorded.

`POST /v1/sessions` (admin key) opens a session and gives it its own key and
`base_url` (`/sessions/{id}/v1`); the program's OpenAI client sends its chat and
completion requests there, and every call is recorded as a `Call` (rollout/segments.py):
the prompt ids the policy read, the ids it sampled, their logprobs and the weights
version that served them. A call whose messages continue the last call's (its reply and
new turns after it) reads the recorded ids back (`spliced_prompt`), so a multi-turn
session is one token-exact trajectory; a call that rewrote the history starts a new
segment. Rewards arrive per session or per call (`POST .../reward`); `trajectories()`
gives the session as trajectories for the trainer.

While training, a session samples with the recipe's settings, not the request's
(`SessionSampling`): the trainer's importance ratios assume the distribution it
configured, so a program's `temperature` or a larger `max_tokens` is overridden.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import secrets
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ponder.models.chat import encode_chat
from ponder.rollout.segments import Call, segment_trajectory, segments, spliced_prompt
from ponder.serve.errors import APIError, bad_request
from ponder.tools.parsers import HermesParser
from ponder.types import Trajectory

_PARSER = HermesParser()  # the calls of a reply, as serve reads them (serve/chat.py)
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass(frozen=True)
class SessionSampling:
    """How a session's calls are sampled while training (None: as the request asks).

    temperature, top_p: override the request's. max_tokens: the most tokens one call
    may generate (a request asking more gets this many). max_context: the longest
    prompt + completion of one call (a longer prompt is refused, 400)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_context: int | None = None

    def apply(self, temperature: float, top_p: float, asked: int | None, prompt_tokens: int
              ) -> tuple[float, float, int | None]:  # fmt: skip
        """(temperature, top_p, max_tokens) of one call; 400 when the prompt leaves no room."""
        temperature = temperature if self.temperature is None else self.temperature
        top_p = top_p if self.top_p is None else self.top_p
        caps = [n for n in (asked, self.max_tokens) if n is not None]
        if self.max_context is not None:
            room = self.max_context - prompt_tokens
            if room < 1:
                raise bad_request(f"the session's context is {prompt_tokens} tokens, at the episode's limit of "
                                  f"{self.max_context} (rollout.sampling.max_total_tokens)", param="messages",
                                  code="context_length_exceeded")  # fmt: skip
            caps.append(room)
        return temperature, top_p, min(caps) if caps else None


@dataclass
class Session:
    """One episode's calls (see module doc). `key` authorises its calls and its reward;
    `drift` counts replies the template would have tokenised differently from what was
    sampled; `rewrites` counts calls that started a new segment."""

    id: str
    key: str
    task_id: str = ""
    version: int = 0  # the weights version when it opened (staleness is counted from it)
    sampling: SessionSampling = field(default_factory=SessionSampling)
    serving: int = 0  # the weights version its next call is served with
    created: float = field(default_factory=time.time)
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    ended: bool = False
    drift: int = 0
    rewrites: int = 0
    _messages: list[list[dict[str, Any]]] = field(default_factory=list, repr=False)
    _replies: list[str] = field(default_factory=list, repr=False)

    def prompt_ids(self, tokenizer: Any, eos_ids: Collection[int], messages: list[dict[str, Any]]) -> list[int]:
        """The ids the policy reads for `messages` (plain template messages): built on
        the last call's recorded ids when they continue it, else encoded afresh."""
        if self.calls:
            last, known = self.calls[-1], self._messages[-1]
            faithful = len(messages) > len(known) and _same_reply(messages[len(known)], self._replies[-1])
            spliced = spliced_prompt(tokenizer, eos_ids, last, known, messages) if faithful else None
            if spliced is not None:
                ids, drifted = spliced
                self.drift += drifted
                return ids
            self.rewrites += 1
        return encode_chat(tokenizer, messages)

    def job_key(self) -> str:
        """The generation key of this session's calls, `task_id#session_id`: a scripted
        backend (a reference solver served as the model) serves turn k of task_id to call k."""
        return f"{self.task_id}#{self.id}"

    def record(self, messages: list[dict[str, Any]], prompt_ids: list[int], result: Any, reply_text: str) -> Call:
        """Keep one generated reply (a serve/batcher JobResult; `reply_text` the text the
        program is sent) as a call. A reply sampled under a constraint (tool_choice,
        response_format) is recorded with the policy's own logprobs, before the grammar's
        mask: the trainer recomputes unmasked logprobs (it does not replay serve's
        per-call grammars), so these keep its importance ratio exact at the sampling
        weights; the grammar's forced tokens are then trained as the policy's choice."""
        logprobs = result.policy_logprobs if result.policy_logprobs is not None else result.logprobs
        call = Call(f"call-{len(self.calls)}", list(prompt_ids), list(result.token_ids), list(logprobs),
                    self.serving, result.text, result.finish_reason, tool_calls=_PARSER.parse(reply_text).calls)  # fmt: skip
        self.calls.append(call)
        self._messages.append([dict(m) for m in messages])
        self._replies.append(reply_text)
        return call

    def post_reward(self, value: Any, call_id: str | None = None) -> None:
        """A reward for the session, or for one call (per-turn credit); 400 if not a finite number."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad_request(f"reward must be a finite number, got {value!r}", param="reward")
        if call_id is None:
            self.reward = float(value)
            return
        call = next((c for c in self.calls if c.id == call_id), None)
        if call is None:
            raise APIError(404, f"session {self.id} has no call {call_id!r}", "not_found", param="call_id")
        call.reward = float(value)

    def trajectories(self, decode: Any = None) -> list[Trajectory]:
        """The session's calls as trajectories, one per segment, in order."""
        return [segment_trajectory(run, self.task_id, decode) for run in segments(self.calls)]

    def summary(self) -> dict[str, Any]:
        """GET /v1/sessions/{id}: the session and every recorded call."""
        calls = [{"id": c.id, "prompt_ids": c.prompt_ids, "completion_ids": c.completion_ids,
                  "logprobs": c.logprobs, "version": c.version, "text": c.text, "finish_reason": c.finish_reason,
                  "reward": c.reward} for c in self.calls]  # fmt: skip
        return {"id": self.id, "task_id": self.task_id, "reward": self.reward, "ended": self.ended,
                "drift": self.drift, "rewrites": self.rewrites, "segments": len(segments(self.calls)),
                "calls": calls}  # fmt: skip


def _same_reply(message: dict[str, Any], reply_text: str) -> bool:
    """Whether the program sent back the reply it got (calls compared as parsed JSON,
    since clients re-serialise arguments)."""
    return message.get("role") == "assistant" and _normal(str(message.get("content") or "")) == _normal(reply_text)


def _normal(text: str) -> tuple[str, tuple[str, ...]]:
    calls = []
    for body in _CALL.findall(text):
        try:
            calls.append(json.dumps(json.loads(body), sort_keys=True))
        except ValueError:
            calls.append(body)
    return _CALL.sub("", text).strip(), tuple(calls)


class Sessions:
    """The open sessions of one server, safe to use from the event loop and the trainer.

    admin_key: what `POST /v1/sessions` and the other control routes need. version:
    the weights version new calls are served with (the trainer sets it each step)."""

    def __init__(self, admin_key: str, sampling: SessionSampling | None = None, limit: int = 4096) -> None:
        self.admin_key = admin_key
        self.sampling = sampling or SessionSampling()
        self.limit = limit
        self.version = 0
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, task_id: str = "") -> Session:
        with self._lock:
            if len(self._sessions) >= self.limit:
                raise APIError(429, f"{self.limit} sessions are open; end some first", "too_many_sessions")
            session = Session("s" + uuid.uuid4().hex[:16], secrets.token_urlsafe(24), task_id, self.version,
                              self.sampling, self.version)  # fmt: skip
            self._sessions[session.id] = session
            return session

    def get(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise APIError(404, f"no session {session_id!r} (ended and collected, or never opened)", "not_found")
        return session

    def authorized(self, session_id: str, key: str | None, admin_allowed: bool = True) -> Session:
        """The session, if `key` is its own (or the admin key, when allowed); else 401."""
        session = self.get(session_id)
        keys = [session.key] + ([self.admin_key] if admin_allowed else [])
        if key is None or not any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
            raise APIError(401, f"this key does not open session {session_id}", "invalid_api_key",
                           kind="authentication_error")  # fmt: skip
        return session

    def is_admin(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self.admin_key.encode())

    def ended(self) -> list[Session]:
        """The sessions whose driver ended them, oldest first."""
        with self._lock:
            return sorted((s for s in self._sessions.values() if s.ended), key=lambda s: s.created)

    def collect(self, session_id: str) -> Session:
        """Remove a session and give it back (the trainer takes its finished episodes)."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            raise APIError(404, f"no session {session_id!r}", "not_found")
        session.ended = True
        return session
