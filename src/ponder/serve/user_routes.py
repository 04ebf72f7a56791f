"""The HTTP endpoints of per-user adapters (`ponder serve --users DIR`, serve/users.py):

- POST /v1/feedback {id, rating: 1 | -1} or {id, rewrite: TEXT} or {id, correction: TEXT}
  or {id, outcome: NUMBER}: feedback on a chat completion (its `id`);
- POST /v1/users/{user}/update [{settings}]: 202 and the update job; the new version is
  served when the job is `done`;
- GET /v1/users/{user}: versions, current and served version, feedback counts, last update;
- POST /v1/users/{user}/rollback {version}: make a saved version current and serve it.

Without --users they answer 404 saying so. The work is SQLite and PEFT: it runs in a
thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ponder.serve.engine import ModelServer
from ponder.serve.errors import APIError


def add_user_routes(
    app: FastAPI, server: ModelServer, authorize: Callable[[Request], None],
    read_json: Callable[[Request, int], Awaitable[Any]],
) -> None:  # fmt: skip
    limit = server.config.max_body_bytes

    def users() -> Any:
        if server.users is None:
            raise APIError(404, "per-user adapters are off: start ponder serve with --users DIR", "users_disabled")
        return server.users

    async def body_or_empty(request: Request) -> Any:
        if request.headers.get("content-length", "") in ("", "0") and "chunked" not in request.headers.get(
            "transfer-encoding", ""
        ):
            return {}
        return await read_json(request, limit)

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        authorize(request)
        personal = users()
        return await asyncio.to_thread(personal.feedback, await read_json(request, limit))

    @app.get("/v1/users/{user}")
    async def user_info(request: Request, user: str) -> dict[str, Any]:
        authorize(request)
        return await asyncio.to_thread(users().info, user)

    @app.post("/v1/users/{user}/update")
    async def update(request: Request, user: str) -> JSONResponse:
        authorize(request)
        personal = users()
        job = await asyncio.to_thread(personal.update, user, await body_or_empty(request))
        return JSONResponse(job, status_code=202)

    @app.post("/v1/users/{user}/rollback")
    async def rollback(request: Request, user: str) -> dict[str, Any]:
        authorize(request)
        personal = users()
        body = await read_json(request, limit)
        version = body.get("version") if isinstance(body, dict) else None
        return await asyncio.to_thread(personal.rollback, user, version)
