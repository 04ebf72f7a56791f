"""The HTTP routes the `tinker` client calls (tinker/resources/*.py), on FastAPI.

Every route but /api/v1/healthz needs the API key when the server has one (the client
sends it as X-API-Key; `Authorization: Bearer` works too). Request bodies are parsed
into the client's own pydantic types and forward_backward's protobuf through
serve/tinker/wire.py; a request the server refuses gets its status and a one-line
`{"detail": reason}`: 400 bad input, 401 key, 404 unknown id or path, 410 a finished
session or a stale sampler, 413 too large. Work is answered with a future's id;
/api/v1/retrieve_future waits up to `poll_s` for the result and otherwise answers 408
with a try-again body, which the client polls again without a warning.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ponder.extras import require
from ponder.serve.tinker.sampling import Stale
from ponder.serve.tinker.service import TinkerService
from ponder.serve.tinker.wire import decode_forward_backward

PROTOBUF = "application/x-protobuf"


class Refused(Exception):
    """An answer other than 200, with its one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())


def _refusal(err: Exception) -> Refused:
    if isinstance(err, Refused):
        return err
    status = 410 if isinstance(err, Stale) else 404 if isinstance(err, LookupError) else 400
    return Refused(status, str(err.args[0]) if err.args else type(err).__name__)


def _answer(handler: Callable[..., Any], *args: Any) -> Any:
    """A service handler's answer; its ValueError / LookupError / Stale as a Refused."""
    try:
        return handler(*args)
    except (ValueError, LookupError) as err:
        raise _refusal(err) from None


def create_tinker_app(service: TinkerService) -> FastAPI:
    """The FastAPI app serving `service`."""
    types = require("tinker.types", "tinker", "ponder tinker-serve")
    app = FastAPI(title="ponder tinker-serve", docs_url=None, redoc_url=None, openapi_url=None)
    config = service.config

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = exc.detail
        if exc.status_code == 404:
            reason = f"{request.method} {request.url.path}: not a route of this server"
        return JSONResponse({"detail": str(reason)}, status_code=exc.status_code)

    async def body(request: Request) -> bytes:
        _authorize(request, config.api_key)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > config.max_body_bytes:
            raise Refused(413, f"the request body is larger than this server's limit of {config.max_body_bytes} bytes")
        raw = await request.body()
        if len(raw) > config.max_body_bytes:
            raise Refused(413, f"the request body is larger than this server's limit of {config.max_body_bytes} bytes")
        return raw

    async def parsed(request: Request, model: Any) -> Any:
        raw = await body(request)
        try:
            return model.model_validate_json(raw or b"{}")
        except Exception as err:  # pydantic's ValidationError: one line naming the field
            raise Refused(400, f"{model.__name__}: {_first_error(err)}") from None

    _session_routes(app, service, types, body, parsed)
    _training_routes(app, service, types, body, parsed)
    _sampling_routes(app, service, types, body, parsed)
    return app


def _authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = request.headers.get("x-api-key") or (token.strip() if scheme.lower() == "bearer" else None)
    # Compared in constant time: the answer's timing must not reveal how much of a guess was right.
    if given is None or not hmac.compare_digest(given.encode(), api_key.encode()):
        raise Refused(401, "missing or wrong API key (set TINKER_API_KEY to the server's --api-key)")


def _first_error(err: Exception) -> str:
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return str(err).splitlines()[0]
    found = errors()
    first = found[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


def _session_routes(app: FastAPI, service: TinkerService, types: Any, body: Any, parsed: Any) -> None:
    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config(request: Request) -> dict[str, Any]:
        await parsed(request, types.ClientConfigRequest)
        return service.client_config(types)

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config(request: Request) -> dict[str, Any]:
        await parsed(request, types.ClientConfigRequest)
        return types.ClientDynamicConfigResponse().model_dump(mode="json")

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities(request: Request) -> dict[str, Any]:
        await body(request)
        return service.capabilities()

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        await parsed(request, types.CreateSessionRequest)
        return service.create_session()

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        beat = await parsed(request, types.SessionHeartbeatRequest)
        return _answer(service.heartbeat, beat.session_id)

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(request: Request, session_id: str) -> dict[str, Any]:
        await body(request)
        return _answer(service.finish, session_id)

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request) -> dict[str, str]:
        await body(request)  # the client's diagnostics; nothing here reads them
        return {"status": "accepted"}


def _training_routes(app: FastAPI, service: TinkerService, types: Any, body: Any, parsed: Any) -> None:
    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        return _answer(service.create_model, await parsed(request, types.CreateModelRequest))

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        return _answer(service.get_info, (await parsed(request, types.GetInfoRequest)).model_id)

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        raw = await body(request)
        if request.headers.get("content-encoding", "identity") != "identity":
            raise Refused(400, "send forward_backward uncompressed (this server's client config asks for that)")
        return _answer(lambda: service.forward_backward(decode_forward_backward(raw)))

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        return _answer(service.optim_step, await parsed(request, types.OptimStepRequest), types)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        return _answer(service.save_weights, await parsed(request, types.SaveWeightsRequest))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        return _answer(service.save_weights_for_sampler, await parsed(request, types.SaveWeightsForSamplerRequest))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        return _answer(service.load_weights, await parsed(request, types.LoadWeightsRequest))

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        asked = await parsed(request, types.FutureRetrieveRequest)
        future = service.worker.future(asked.request_id)
        if future is None:
            raise Refused(404, f"unknown request_id {asked.request_id!r} (or its result was retrieved long ago)")
        done, _ = await asyncio.wait([asyncio.wrap_future(future)], timeout=service.config.poll_s)
        if not done:
            return JSONResponse({"type": "try_again", "request_id": asked.request_id, "queue_state": "active"}, 408)
        result = future.result()
        if result.error is not None:
            return JSONResponse({"error": result.error, "category": result.category})
        if result.proto is not None:
            return Response(result.proto, media_type=PROTOBUF)
        return JSONResponse(result.json)


def _sampling_routes(app: FastAPI, service: TinkerService, types: Any, body: Any, parsed: Any) -> None:
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        return _answer(service.create_sampling_session, await parsed(request, types.CreateSamplingSessionRequest))

    @app.get("/api/v1/samplers/{sampler_id}")
    async def sampler(request: Request, sampler_id: str) -> dict[str, Any]:
        await body(request)
        return _answer(service.get_sampler, sampler_id)

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        return _answer(service.asample, await parsed(request, types.SampleRequest))
