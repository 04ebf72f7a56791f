"""A real OpenAI-compatible chat-completions server (FastAPI + uvicorn on 127.0.0.1) that
replays scripted replies, for testing the HTTP policy end to end."""

import contextlib
import json
import socket

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..uvicorn_thread import loopback_socket, serving


def create_app(replies, requests):
    """Each POST takes the next reply: {"content": str}, {"tool_calls": [(name, args)]},
    or {"status": int} (an error answer)."""
    app = FastAPI()
    queue = list(replies)

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        requests.append(body)
        reply = queue.pop(0) if queue else {"status": 503}
        if "status" in reply:
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=reply["status"])
        calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(reply.get("tool_calls", []))
        ]
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        if body.get("stream"):
            return StreamingResponse(_sse(reply.get("content", ""), calls, usage), media_type="text/event-stream")
        message = {"role": "assistant", "content": reply.get("content")}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}

    return app


def _sse(content, calls, usage):
    def event(payload):
        return f"data: {json.dumps(payload)}\n\n"

    for start in range(0, len(content), 3):
        yield event({"choices": [{"index": 0, "delta": {"content": content[start : start + 3]}, "finish_reason": None}]})
    for i, call in enumerate(calls):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        first = {"index": i, "id": call["id"], "function": {"name": call["function"]["name"], "arguments": arguments[:half]}}
        yield event({"choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]})
        rest = {"index": i, "function": {"arguments": arguments[half:]}}
        yield event({"choices": [{"index": 0, "delta": {"tool_calls": [rest]}, "finish_reason": None}]})
    finish = "tool_calls" if calls else "stop"
    yield event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage})
    yield "data: [DONE]\n\n"


@contextlib.contextmanager
def running(replies):
    """Serve scripted replies on a free loopback port; yield (base_url, received requests)."""
    requests = []
    sock = loopback_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(replies, requests), host="127.0.0.1", port=port, log_level="warning"))
    with serving(server, sock, timeout_s=10, must_stop=False):
        yield f"http://127.0.0.1:{port}/v1", requests


def closed_port_url():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
