"""The gateway's HTTP routes (serve/sessions.py), beside ponder serve's own:

- POST /v1/sessions [{"task_id"}] (admin key) → {"id", "base_url", "api_key"};
- GET /v1/sessions/{id} (admin or the session's key) → the session and its calls;
- POST /v1/sessions/{id}/reward {"reward": NUMBER, "call_id"?} (admin or session key);
- POST /v1/sessions/{id}/end (admin or session key);
- /sessions/{id}/v1/chat/completions, /sessions/{id}/v1/completions, /sessions/{id}/v1/models:
  OpenAI's routes for the session's program (its own key only), every call recorded.

The model a session serves is `policy` (or the server's base model name); another
name is a 404. With a staleness bound, a session whose weights version is more than
`max_staleness` versions behind gets 429 with Retry-After (asynchronous training).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ponder.serve.app import chat_completion, create_app, read_json, text_completion
from ponder.serve.engine import ModelServer
from ponder.serve.errors import APIError, bad_request
from ponder.serve.protocol import ChatRequest, CompletionRequest, parse_request
from ponder.serve.sessions import Session, Sessions

POLICY_NAME = "policy"


def bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key")


def create_gateway_app(server: ModelServer, sessions: Sessions, max_staleness: int | None = None) -> FastAPI:
    """ponder serve's app with the session routes added (see module docstring)."""
    app = create_app(server)
    _add_control_routes(app, sessions, server.config.max_body_bytes)
    _add_call_routes(app, server, sessions, max_staleness)
    return app


def _add_control_routes(app: FastAPI, sessions: Sessions, limit: int) -> None:
    """Open, show, reward and end sessions."""

    def admin(request: Request) -> None:
        if not sessions.is_admin(bearer(request)):
            raise APIError(401, "this route needs the gateway's admin key (Authorization: Bearer KEY)",
                           "invalid_api_key", kind="authentication_error")  # fmt: skip

    @app.post("/v1/sessions")
    async def open_session(request: Request) -> dict[str, Any]:
        admin(request)
        body = await read_json(request, limit) if request.headers.get("content-length", "0") != "0" else {}
        task_id = body.get("task_id", "") if isinstance(body, dict) else ""
        if not isinstance(task_id, str):
            raise bad_request("task_id must be a string", param="task_id")
        session = sessions.open(task_id)
        base = str(request.base_url).rstrip("/")
        return {"id": session.id, "base_url": f"{base}/sessions/{session.id}/v1", "api_key": session.key}

    @app.get("/v1/sessions/{session_id}")
    async def show(request: Request, session_id: str) -> dict[str, Any]:
        return sessions.authorized(session_id, bearer(request)).summary()

    @app.post("/v1/sessions/{session_id}/reward")
    async def reward(request: Request, session_id: str) -> dict[str, Any]:
        session = sessions.authorized(session_id, bearer(request))
        body = await read_json(request, limit)
        if not isinstance(body, dict) or "reward" not in body:
            raise bad_request('the body must be {"reward": NUMBER} (and optionally "call_id")', param="reward")
        session.post_reward(body["reward"], body.get("call_id"))
        return {"id": session.id, "reward": session.reward}

    @app.post("/v1/sessions/{session_id}/end")
    async def end(request: Request, session_id: str) -> dict[str, Any]:
        session = sessions.authorized(session_id, bearer(request))
        session.ended = True
        return {"id": session.id, "ended": True, "calls": len(session.calls)}


def _add_call_routes(app: FastAPI, server: ModelServer, sessions: Sessions, max_staleness: int | None) -> None:
    """A session program's OpenAI routes: its own key, the policy's name, fresh enough."""
    limit = server.config.max_body_bytes

    def session_for_calls(request: Request, session_id: str, model: str) -> Session:
        session = sessions.authorized(session_id, bearer(request), admin_allowed=False)
        if session.ended:
            raise APIError(409, f"session {session_id} has ended", "session_ended")
        if model not in (POLICY_NAME, server.base_name):
            raise APIError(404, f"the model {model!r} does not exist; a session serves {POLICY_NAME!r}",
                           "model_not_found", param="model")  # fmt: skip
        behind = sessions.version - session.version
        if max_staleness is not None and behind > max_staleness:
            raise APIError(429, f"session {session_id} started {behind} weight versions ago (the bound is "
                                f"{max_staleness}); end it and open a new one", "stale_session")  # fmt: skip
        session.serving = sessions.version
        return session

    @app.get("/sessions/{session_id}/v1/models")
    async def models(request: Request, session_id: str) -> dict[str, Any]:
        sessions.authorized(session_id, bearer(request), admin_allowed=False)
        return {"object": "list", "data": [{"id": POLICY_NAME, "object": "model", "owned_by": "ponder"}]}

    @app.post("/sessions/{session_id}/v1/chat/completions", response_model=None)
    async def chat(request: Request, session_id: str) -> JSONResponse | StreamingResponse:
        body = parse_request(await read_json(request, limit), ChatRequest)
        session = session_for_calls(request, session_id, body.model)
        return await chat_completion(server, body.model_copy(update={"model": server.base_name}), session)

    @app.post("/sessions/{session_id}/v1/completions", response_model=None)
    async def completions(request: Request, session_id: str) -> JSONResponse | StreamingResponse:
        body = parse_request(await read_json(request, limit), CompletionRequest)
        session = session_for_calls(request, session_id, body.model)
        return await text_completion(server, body.model_copy(update={"model": server.base_name}), session)
