"""An HTTP retrieval server with Search-R1's API, so either side can be swapped.

`POST /retrieve` takes `{"queries": [...], "topk": int?, "return_scores": bool}` and
answers `{"result": [[{"document": {"id", "contents"}, "score"}, …], …]}` with
scores, or `{"result": [[{"id", "contents"}, …], …]}` without, one list per query,
best first. `GET /health` answers when the server is up (without a key: it is what
load balancers and `ponder` itself probe).

Limits (ServerLimits): a body over `max_body_bytes` gets 413 (from Content-Length
before anything is read, else while reading); more than `max_queries` queries or a
topk over `max_topk` get 422; with an `api_key`, /retrieve answers 401 unless the
request carries it (`Authorization: Bearer KEY` or `X-API-Key: KEY`), before its body
is read. Requests are answered concurrently: a retriever that declares
`thread_safe = True` is searched without a lock; any other is searched a few queries
at a time under a first-come-first-served lock, so one large request cannot hold
every other client behind it.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

from ponder.extras import require

uvicorn = require("uvicorn", "serve", "ponder serve-retriever")
require("fastapi", "serve", "ponder serve-retriever")

from fastapi import FastAPI, HTTPException, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from ponder.tools.retrieval.corpus import Hit, Retriever  # noqa: E402

logger = logging.getLogger(__name__)

API_KEY_ENV = "PONDER_RETRIEVER_API_KEY"


@dataclass
class ServerLimits:
    """What one request may ask of the server.

    max_body_bytes: largest request body (413 above it).
    max_queries: most queries in one request (422 above it).
    max_topk: largest topk a request may ask for (422 above it).
    api_key: required on /retrieve when set (401 without it); None serves everyone.
    chunk_queries: queries searched per turn of the lock, for retrievers that are not
        thread-safe: a large request waits behind requests that came after it between
        its chunks.
    """

    max_body_bytes: int = 1_000_000
    max_queries: int = 256
    max_topk: int = 100
    api_key: Optional[str] = None
    chunk_queries: int = 8

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_queries", "max_topk", "chunk_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset to serve without one)")


class RetrieveRequest(BaseModel):
    """Search-R1's QueryRequest; `topk` falls back to the server's default when absent."""

    queries: list[str]
    topk: Optional[int] = Field(default=None, ge=1)
    return_scores: bool = False


class FifoLock:
    """A lock granted in arrival order. threading.Lock lets the thread that just released
    it take it straight back, so a large request would hold it across all its chunks."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._condition.wait()
        try:
            yield
        finally:
            with self._condition:
                self._serving += 1
                self._condition.notify_all()


def _passage(hit: Hit) -> dict[str, Any]:
    return {"id": hit.doc_id, "contents": hit.contents}


def _search(retriever: Retriever, lock: FifoLock | None, queries: list[str], topk: int, chunk: int) -> list[list[Hit]]:
    if lock is None:
        return retriever.search(queries, topk)
    rankings: list[list[Hit]] = []
    for start in range(0, len(queries), chunk):
        with lock.turn():
            rankings.extend(retriever.search(queries[start : start + chunk], topk))
    return rankings


def _authorized(request: Request, api_key: str) -> bool:
    given = request.headers.get("x-api-key")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if given is None and scheme.lower() == "bearer":
        given = token.strip()
    # Compared in constant time: the answer's timing must not reveal how much of a guess was right.
    return given is not None and hmac.compare_digest(given.encode(), api_key.encode())


def create_app(retriever: Retriever, topk: int = 3, limits: ServerLimits | None = None) -> FastAPI:
    """A FastAPI app serving `retriever`; `topk` is used when a request leaves it out."""
    limits = limits or ServerLimits()
    app = FastAPI(title="ponder retrieval server", max_body_size=limits.max_body_bytes)
    # Hugging Face fast tokenizers raise "Already borrowed" when used from two threads.
    lock = None if getattr(retriever, "thread_safe", False) else FifoLock()

    if limits.api_key is not None:
        api_key = limits.api_key

        @app.middleware("http")
        async def require_key(request: Request, call_next: Any) -> Any:
            if request.url.path != "/health" and not _authorized(request, api_key):
                detail = "missing or wrong API key (send Authorization: Bearer KEY or X-API-Key: KEY)"
                return JSONResponse({"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            return await call_next(request)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "retriever": type(retriever).__name__, "topk": topk}

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict[str, Any]:
        if len(request.queries) > limits.max_queries:
            raise HTTPException(422, f"{len(request.queries)} queries in one request; at most {limits.max_queries}")
        if request.topk is not None and request.topk > limits.max_topk:
            raise HTTPException(422, f"topk {request.topk} is larger than {limits.max_topk}")
        try:
            rankings = _search(retriever, lock, request.queries, request.topk or topk, limits.chunk_queries)
        except Exception as exc:
            # Answer the failure ourselves: an exception left to uvicorn also drops the
            # keep-alive connection, so the client's next request would meet a reset.
            logger.exception("retrieval failed")
            raise HTTPException(status_code=500, detail=f"{type(exc).__name__}: {exc}") from exc
        if request.return_scores:
            result = [[{"document": _passage(h), "score": h.score} for h in hits] for hits in rankings]
        else:
            result = [[_passage(h) for h in hits] for hits in rankings]
        return {"result": result}

    return app


def build_server(
    retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, topk: int = 3, log_level: str = "info",
    limits: ServerLimits | None = None,
) -> uvicorn.Server:  # fmt: skip
    """A uvicorn server for `retriever`, not yet running: call .run() (or run it in a
    thread, optionally on a socket you bound yourself) and set .should_exit to stop it."""
    config = uvicorn.Config(create_app(retriever, topk, limits), host=host, port=port, log_level=log_level)
    return uvicorn.Server(config)


def serve(
    retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, topk: int = 3,
    limits: ServerLimits | None = None,
) -> None:  # fmt: skip
    """Serve `retriever` until interrupted. Loopback by default: pass host="0.0.0.0" to expose it
    (then set an API key: `limits.api_key`, or $PONDER_RETRIEVER_API_KEY via the CLI)."""
    build_server(retriever, host=host, port=port, topk=topk, limits=limits).run()


def api_key_from_env() -> str | None:
    """$PONDER_RETRIEVER_API_KEY, or None when it is unset or empty."""
    return os.environ.get(API_KEY_ENV) or None
