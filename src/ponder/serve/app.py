"""The HTTP layer: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`
(and, with --users, the per-user adapter endpoints of serve/user_routes.py).

Requests are read and checked here (size, JSON, fields, model name, API key) and
every refusal is OpenAI's error body (serve/errors.py). Generation happens on the
server's Generator (serve/engine.py: ponder's batching worker, or a vLLM server),
awaited without blocking the event loop, so requests that arrive together are
generated together; nothing here depends on which backend it is.

Streaming (`stream: true`) sends server-sent events in OpenAI's chunk format and ends
with `data: [DONE]`. Text goes out as it is decoded, except a tail that could still
become a stop string or a `<tool_call>` (held back until it is decided); calls come
as `tool_calls` deltas at the end. A request that must be checked before any of it
is sent (a forced tool choice, a response_format) is generated whole, then sent as
chunks. A client that goes away mid-stream cancels its row at the next token; the
server keeps serving the rest of the batch.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ponder.serve.batcher import Job, JobResult
from ponder.serve.chat import (
    TOOL_OPEN, CallDeltas, ChatPlan, ChatReply, complete_calls, cut_at_stop, holdback_start, plan_chat, read_reply,
)
from ponder.serve.engine import ModelServer
from ponder.serve.errors import APIError, bad_request, model_output_error
from ponder.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    api_error_from,
    max_tokens_of,
    parse_request,
    stop_list,
)
from ponder.serve.scoring import prompt_logprobs
from ponder.serve.user_routes import add_user_routes

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON: 413 past `limit` bytes (from Content-Length before
    reading, else while reading), 400 when it is not JSON."""
    too_large = APIError(413, f"the request body is larger than this server's limit of {limit} bytes "
                              "(--max-body-bytes)", "request_too_large")  # fmt: skip
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except json.JSONDecodeError as err:
        raise bad_request(f"the request body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
                          code="invalid_json") from None  # fmt: skip
    except (UnicodeDecodeError, RecursionError, ValueError) as err:
        raise bad_request(f"the request body is not valid JSON: {type(err).__name__}", code="invalid_json") from None


def _authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key")
    # Compared in constant time: the answer's timing must not reveal how much of a guess was right.
    if given is None or not hmac.compare_digest(given.encode(), api_key.encode()):
        raise APIError(401, "missing or wrong API key (send Authorization: Bearer KEY)", "invalid_api_key")


def create_app(server: ModelServer) -> FastAPI:
    """The FastAPI app serving `server`'s models."""
    config = server.config
    app = FastAPI(title="ponder serve", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        headers = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": "1"}}.get(exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(APIError(exc.status_code, str(exc.detail), code).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        error = api_error_from(exc)
        return JSONResponse(error.body(), status_code=error.status)

    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any] | JSONResponse:
        problem = await asyncio.to_thread(server.health)  # vLLM's own /health is asked over HTTP
        if problem is not None:
            return JSONResponse({"status": "unavailable", "backend": server.backend, "reason": problem}, 503)
        return {"status": "ok", "backend": server.backend, "models": [m["id"] for m in server.models()]}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _authorize(request, config.api_key)
        return {"object": "list", "data": server.models()}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> dict[str, Any]:
        _authorize(request, config.api_key)
        server.adapter_for(model_id)
        return next(m for m in server.models() if m["id"] == model_id)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        _authorize(request, config.api_key)
        body = parse_request(await read_json(request, config.max_body_bytes), ChatRequest)
        return await chat_completion(server, body)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        _authorize(request, config.api_key)
        body = parse_request(await read_json(request, config.max_body_bytes), CompletionRequest)
        return await text_completion(server, body)

    add_user_routes(app, server, lambda request: _authorize(request, config.api_key), read_json)
    return app


def _sampling(request: Any, asked: int | None, session: Any, prompt_tokens: int) -> tuple[float, float, int | None]:
    """(temperature, top_p, max_tokens) for a request: as asked, or as a session sets them."""
    if session is None:
        return request.temperature, request.top_p, asked
    return session.sampling.apply(request.temperature, request.top_p, asked, prompt_tokens)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


def _check_choices(server: ModelServer, count: int, stream: bool) -> None:
    if count > server.config.max_choices:
        raise bad_request(f"{count} choices asked for (n times prompts); this server gives at most "
                          f"{server.config.max_choices}", param="n")  # fmt: skip
    if stream and count > 1:
        raise bad_request("stream: true works with one choice (n 1, one prompt)", param="n")


# --- chat ----------------------------------------------------------------------------


def _personal_user(server: ModelServer, request: ChatRequest) -> str | None:
    """The user whose adapter answers (and who is logged): only with --users and the base model."""
    if request.user is None or server.users is None or request.model != server.base_name:
        return None
    return request.user


async def chat_completion(server: ModelServer, request: ChatRequest,
                          session: Any = None) -> JSONResponse | StreamingResponse:  # fmt: skip
    """`session`: a gateway session (serve/sessions.py) that builds the prompt on its
    recorded ids, sets the sampling, and records every reply as a call."""
    adapter = server.adapter_for(request.model)
    user = _personal_user(server, request)
    if user is not None:
        adapter = await asyncio.to_thread(server.users.route, user)
    _check_choices(server, request.n, request.stream)
    plan = plan_chat(request)
    server.check_constraint(plan.constraint)
    if session is None:
        prompt_ids = server.encode_chat(plan.messages)
    else:
        prompt_ids = session.prompt_ids(server.tokenizer, server.eos_ids, plan.messages)
    temperature, top_p, asked = _sampling(request, max_tokens_of(request), session, len(prompt_ids))
    budget = server.token_budget(prompt_ids, asked)
    stops = stop_list(request.stop)

    def job(on_text: Callable[[str], None] | None = None) -> Job:
        job = Job(prompt_ids, budget, adapter, temperature, top_p, stops, on_text, plan.constraint)
        if session is not None and request.n == 1:  # `task#session`: a scripted teacher's turns follow it
            job.key = session.job_key()
        return job

    meta = {"id": "chatcmpl-" + uuid.uuid4().hex, "created": int(time.time()), "model": request.model}

    async def log(text: str, result: JobResult) -> None:
        """A user's chat is an interaction (id = the completion's id), recorded before the
        reply is sent, so feedback on it can follow at once. With n > 1, the first choice.
        A session records every choice as a call."""
        if session is not None:
            session.record(plan.messages, prompt_ids, result, text)
        if user is not None:
            await asyncio.to_thread(server.users.log, user, plan.messages, text, result.adapter, meta["id"])

    usage_wanted = bool(request.stream_options and request.stream_options.include_usage)
    if request.stream:
        events = _stream_chat(server, job, plan, stops, meta, len(prompt_ids), usage_wanted, log)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    results = await asyncio.gather(*[_chat_choice(server, job, plan, stops) for _ in range(request.n)])
    used = sum(tokens for _, _, tokens, _ in results)
    for *_, logged in results if session is not None else results[:1]:
        await log(*logged)
    choices = [{"index": i, "message": _message(reply), "logprobs": None, "finish_reason": finish}
               for i, (reply, finish, _, _) in enumerate(results)]  # fmt: skip
    body = {**meta, "object": "chat.completion", "choices": choices, "usage": _usage(len(prompt_ids), used)}
    return JSONResponse(body)


async def _chat_choice(
    server: ModelServer, job: Callable[[], Job], plan: ChatPlan, stops: list[str]
) -> tuple[ChatReply, str, int, tuple[str, JobResult]]:
    """One choice: (reply, finish_reason, tokens generated, (the text the model wrote, its
    result)). A forced call or response_format is sampled to match, so only a reply cut
    short by max_tokens can miss it (see read_result)."""
    result = await server.generate(job())
    _, reply, finish = read_result(result, plan, stops)
    return reply, finish, len(result.token_ids), (cut_at_stop(result.text, stops)[0], result)


def read_result(result: JobResult, plan: ChatPlan, stops: list[str]) -> tuple[str, ChatReply, str]:
    """(the reply's text, the reply, finish_reason) of a finished job. A forced reply cut
    by max_tokens after one or more complete calls returns those calls with finish_reason
    `length` (the unfinished call is dropped); one with no complete call, or JSON cut
    before its document closed, is a 422 (unmet)."""
    text, _ = cut_at_stop(result.text, stops)
    reply = read_reply(text, plan)
    if reply.problem is not None and result.finish_reason == "length" and (kept := complete_calls(text, plan)):
        text, reply = kept
        return text, reply, "length"
    unmet(reply, plan, result)
    return text, reply, "tool_calls" if reply.tool_calls else result.finish_reason


def unmet(reply: ChatReply, plan: ChatPlan, result: JobResult) -> None:
    """A 422 when the reply misses what the request demands (it was cut at max_tokens)."""
    if reply.problem is None:
        return
    what, code, none = (("first tool call", "tool_choice_unmet", "no complete call") if plan.forced else
                        ("JSON of response_format", "response_format_unmet", "no complete document"))  # fmt: skip
    why = (f"max_tokens ({len(result.token_ids)}) ran out before the {what} was complete, so there is {none} "
           "to return; raise max_tokens" if result.finish_reason == "length"
           else f"the model did not write a valid {what.removeprefix('first ')}")  # fmt: skip
    raise model_output_error(f"{why}: {reply.problem}", code)


def _message(reply: ChatReply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def _chat_chunk(meta: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return sse({**meta, "object": "chat.completion.chunk", "choices": [choice]})


def _call_deltas(meta: dict[str, Any], calls: list[dict[str, Any]]) -> list[str]:
    return [_chat_chunk(meta, {"tool_calls": [{"index": i, **call}]}) for i, call in enumerate(calls)]


def _usage_chunk(meta: dict[str, Any], usage: dict[str, int]) -> str:
    return sse({**meta, "object": "chat.completion.chunk", "choices": [], "usage": usage})


class _LiveText:
    """The text of one job as it is generated, for streaming: `deltas()` yields what can
    be shown (see holdback_start); `finish()` the job's result once it is done."""

    def __init__(self, server: ModelServer, make_job: Callable[..., Job], markers: list[str]) -> None:
        loop = asyncio.get_running_loop()
        self.updates: asyncio.Queue[str | None] = asyncio.Queue()
        self.job = make_job(lambda text: loop.call_soon_threadsafe(self.updates.put_nowait, text))
        self.future = server.generator.submit(self.job)
        self.future.add_done_callback(lambda _: loop.call_soon_threadsafe(self.updates.put_nowait, None))
        self.markers = markers
        self.sent = 0

    async def texts(self) -> AsyncIterator[str]:
        """The whole text so far, after every token (for readers that parse it)."""
        while (text := await self.updates.get()) is not None:
            yield text

    async def deltas(self) -> AsyncIterator[str]:
        while (text := await self.updates.get()) is not None:
            end = holdback_start(text, self.markers)
            if end > self.sent:
                yield text[self.sent : end]
                self.sent = end

    def finish(self) -> JobResult:
        return self.future.result()


async def _stream_chat(
    server: ModelServer, make_job: Callable[..., Job], plan: ChatPlan, stops: list[str], meta: dict[str, Any],
    prompt_tokens: int, usage_wanted: bool, log: Callable[[str, JobResult], Awaitable[None]],
) -> AsyncIterator[str]:  # fmt: skip
    """A chat reply as it is generated: content deltas, or, for a forced tool choice, the
    calls' deltas (name first, then the arguments as they grow)."""
    live = _LiveText(server, make_job, stops + ([TOOL_OPEN] if plan.tools else []))
    calls = CallDeltas() if plan.forced else None
    try:
        yield _chat_chunk(meta, {"role": "assistant", "content": ""})
        async for chunk in _content_chunks(live, meta) if calls is None else _call_chunks(live, calls, meta):
            yield chunk
        try:
            result = live.finish()
            await log(cut_at_stop(result.text, stops)[0], result)
            text, reply, finish = read_result(result, plan, stops)
        except Exception as exc:  # the status line has gone out: the error travels as an event
            yield sse(api_error_from(exc).body())
            yield DONE
            return
        for chunk in _closing_chunks(meta, text, reply, live.sent, calls):
            yield chunk
        yield _chat_chunk(meta, {}, finish)
        if usage_wanted:
            yield _usage_chunk(meta, _usage(prompt_tokens, len(result.token_ids)))
        yield DONE
    finally:
        live.job.cancelled = True  # a no-op once it is done; ends its row if the client left


async def _content_chunks(live: _LiveText, meta: dict[str, Any]) -> AsyncIterator[str]:
    async for delta in live.deltas():
        yield _chat_chunk(meta, {"content": delta})


async def _call_chunks(live: _LiveText, calls: CallDeltas, meta: dict[str, Any]) -> AsyncIterator[str]:
    async for text in live.texts():
        for delta in calls.feed(text):
            yield _chat_chunk(meta, {"tool_calls": [delta]})


def _closing_chunks(meta: dict[str, Any], text: str, reply: ChatReply, sent: int,
                    calls: CallDeltas | None) -> list[str]:  # fmt: skip
    """What is left to stream once the reply is complete."""
    if calls is not None:
        return [_chat_chunk(meta, {"tool_calls": [delta]}) for delta in calls.feed(text)]
    rest = text[sent : text.find(TOOL_OPEN)] if reply.tool_calls else text[sent:]
    chunks = [_chat_chunk(meta, {"content": rest})] if rest.strip() or (rest and not reply.tool_calls) else []
    return chunks + _call_deltas(meta, reply.tool_calls)


# --- completions ---------------------------------------------------------------------


def _prompt_ids(server: ModelServer, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        prompts = [server.encode_text(prompt)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    else:
        prompts = [server.encode_text(p) if isinstance(p, str) else list(p) for p in prompt]
    vocabulary = len(server.tokenizer)
    if not prompts:
        raise bad_request("prompt is an empty list", param="prompt")
    for ids in prompts:
        if not ids:
            raise bad_request("prompt is empty", param="prompt")
        if any(not 0 <= token < vocabulary for token in ids):
            raise bad_request(f"prompt has a token id outside the vocabulary (0-{vocabulary - 1})", param="prompt")
    return prompts


async def text_completion(server: ModelServer, request: CompletionRequest,
                          session: Any = None) -> JSONResponse | StreamingResponse:  # fmt: skip
    """`session`: as for chat_completion (the prompt's ids as given; each reply a call)."""
    adapter = server.adapter_for(request.model)
    prompts = _prompt_ids(server, request.prompt)
    _check_choices(server, len(prompts) * request.n, request.stream)
    sampled = [_sampling(request, request.max_tokens, session, len(ids)) for ids in prompts]
    budgets = [server.token_budget(ids, asked) for ids, (_, _, asked) in zip(prompts, sampled)]
    stops = stop_list(request.stop)

    def job(index: int, on_text: Callable[[str], None] | None = None) -> Job:
        temperature, top_p, _ = sampled[index]
        return Job(prompts[index], budgets[index], adapter, temperature, top_p, stops, on_text)

    meta = {"id": "cmpl-" + uuid.uuid4().hex, "created": int(time.time()), "model": request.model}
    echo = [server.decode(ids) if request.echo else "" for ids in prompts]
    if request.stream:
        usage_wanted = bool(request.stream_options and request.stream_options.include_usage)
        record = None if session is None else (lambda result, text: session.record([], prompts[0], result, text))
        events = _stream_completion(server, lambda on_text: job(0, on_text), stops, meta, echo[0],
                                    len(prompts[0]) if usage_wanted else None, record)  # fmt: skip
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    order = [p for p in range(len(prompts)) for _ in range(request.n)]
    results = await asyncio.gather(*[server.generate(job(p)) for p in order])
    for p, result in zip(order, results) if session is not None else []:
        session.record([], prompts[p], result, cut_at_stop(result.text, stops)[0])
    choices = [{"index": i, "text": echo[p] + cut_at_stop(r.text, stops)[0], "logprobs": None,
                "finish_reason": r.finish_reason} for i, (p, r) in enumerate(zip(order, results))]  # fmt: skip
    if request.prompt_logprobs is not None:
        scored = [await asyncio.to_thread(prompt_logprobs, server, ids, adapter, request.prompt_logprobs)
                  for ids in prompts]  # fmt: skip
        for choice, p in zip(choices, order):
            choice["prompt_logprobs"] = scored[p]
    used = sum(len(r.token_ids) for r in results)
    prompt_tokens = sum(len(prompts[p]) for p in range(len(prompts)))
    body = {**meta, "object": "text_completion", "choices": choices, "usage": _usage(prompt_tokens, used)}
    return JSONResponse(body)


def _completion_chunk(meta: dict[str, Any], text: str, finish: str | None = None) -> str:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return sse({**meta, "object": "text_completion", "choices": [choice]})


async def _stream_completion(
    server: ModelServer, make_job: Callable[..., Job], stops: list[str], meta: dict[str, Any], echo: str,
    usage_prompt_tokens: int | None, record: Callable[[JobResult, str], Any] | None = None,
) -> AsyncIterator[str]:  # fmt: skip
    live = _LiveText(server, make_job, stops)
    try:
        if echo:
            yield _completion_chunk(meta, echo)
        async for delta in live.deltas():
            yield _completion_chunk(meta, delta)
        try:
            result = live.finish()
        except Exception as exc:
            yield sse(api_error_from(exc).body())
            yield DONE
            return
        text, _ = cut_at_stop(result.text, stops)
        if record is not None:
            record(result, text)
        yield _completion_chunk(meta, text[live.sent :], result.finish_reason)
        if usage_prompt_tokens is not None:
            usage = _usage(usage_prompt_tokens, len(result.token_ids))
            yield sse({**meta, "object": "text_completion", "choices": [], "usage": usage})
        yield DONE
    finally:
        live.job.cancelled = True
