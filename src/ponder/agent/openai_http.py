"""A chat policy served by any OpenAI-compatible endpoint (`POST {base_url}/chat/completions`).

The tools are described in the system prompt, as for local models, so the reply is
parsed by the same parser. An endpoint that answers with native `tool_calls` instead
gets them rewritten as Hermes `<tool_call>` blocks, so they too go through the one
parse → validate → call → observe step. Transient failures (connection errors,
timeouts, HTTP 5xx and 429) are retried with exponential backoff, then PolicyError.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ponder.agent.policy import Completion, PolicyError, TextCallback
from ponder.httpretry import one_line
from ponder.rollout.backend import first_stop

# Endpoints accept at most four stop sequences (OpenAI's limit).
_MAX_STOP = 4
_CHARS_PER_TOKEN = 4  # estimate when the endpoint reports no usage


def tool_calls_as_hermes(tool_calls: list[dict[str, Any]]) -> str:
    """OpenAI `tool_calls` (arguments as JSON text) as `<tool_call>{json}</tool_call>` blocks."""
    blocks = []
    for call in tool_calls:
        function = call.get("function") or {}
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            arguments = raw  # left as text: the parser reports it to the model
        blocks.append(json.dumps({"name": function.get("name", ""), "arguments": arguments}, ensure_ascii=False))
    return "".join(f"<tool_call>{block}</tool_call>" for block in blocks)


class OpenAIPolicy:
    """Chat completions over HTTP. `base_url` is the API root, e.g. `http://127.0.0.1:8000/v1`."""

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        temperature: float = 0.0,
        top_p: float = 1.0,
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        api_key: str | None = None,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.name = f"{self.base_url} ({model})"
        self.model = model
        self.sampling = {"temperature": temperature, "top_p": top_p}
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._client.close()

    def count_tokens(self, text: str) -> int:
        return max(1, len(text) // _CHARS_PER_TOKEN) if text else 0

    def complete(
        self,
        messages: list[dict[str, Any]],
        stop: list[str],
        max_new_tokens: int,
        key: str,
        on_text: TextCallback | None = None,
        timeout_s: float | None = None,
        constraint: Any = None,  # a remote endpoint samples on its own: ignored
    ) -> Completion:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m.get("content") or ""} for m in messages],
            "max_tokens": max_new_tokens,
            "stream": on_text is not None,
            **self.sampling,
        }
        if stop:
            payload["stop"] = stop[:_MAX_STOP]
        limit = min(self.timeout_s, timeout_s) if timeout_s is not None else self.timeout_s
        reply = self._with_retries(payload, limit, on_text)
        text, finish = reply["text"], reply["finish_reason"]
        cut = first_stop(text, stop)  # an endpoint may ignore `stop`; enforce it here
        if cut >= 0:
            text, finish = text[:cut], "stop"
        usage = reply.get("usage") or {}
        prompt_chars = sum(len(m.get("content") or "") for m in messages)
        prompt_tokens = int(usage.get("prompt_tokens") or prompt_chars // _CHARS_PER_TOKEN)
        completion_tokens = int(usage.get("completion_tokens") or self.count_tokens(text))
        return Completion(text, prompt_tokens, completion_tokens, finish)

    def _with_retries(self, payload: dict[str, Any], timeout_s: float, on_text: TextCallback | None) -> dict[str, Any]:
        import httpx

        url = f"{self.base_url}/chat/completions"
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                if payload["stream"]:
                    return self._streamed(url, payload, timeout_s, on_text)  # type: ignore[arg-type]
                response = self._client.post(url, json=payload, timeout=timeout_s)
                _raise_for_status(response)
                return _parse_reply(response.json())
            except _Transient as exc:
                reason = str(exc)
            except httpx.TimeoutException:
                reason = f"timed out after {timeout_s:g} s"
            except httpx.TransportError as exc:
                reason = f"could not be reached ({type(exc).__name__})"
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise PolicyError(f"endpoint {url} sent a malformed reply: {one_line(exc)}") from exc
        attempts = self.retries + 1
        raise PolicyError(f"endpoint {url} {reason} after {attempts} attempt{'s' if attempts > 1 else ''}")

    def _streamed(self, url: str, payload: dict[str, Any], timeout_s: float, on_text: TextCallback) -> dict[str, Any]:
        pieces: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish, usage = "eos", None
        with self._client.stream("POST", url, json=payload, timeout=timeout_s) as response:
            if response.status_code >= 400:
                response.read()
            _raise_for_status(response)
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        pieces.append(delta["content"])
                        on_text(delta["content"])
                    _merge_call_deltas(calls, delta.get("tool_calls") or [])
                    finish = _finish(choice.get("finish_reason")) or finish
        text = "".join(pieces) + tool_calls_as_hermes([calls[i] for i in sorted(calls)])
        return {"text": text, "finish_reason": finish, "usage": usage}


class _Transient(Exception):
    """An HTTP answer worth retrying (5xx, 429)."""


def _raise_for_status(response: Any) -> None:
    if response.status_code >= 500 or response.status_code == 429:
        raise _Transient(f"answered HTTP {response.status_code} ({one_line(response.text)})")
    if response.status_code >= 400:
        raise PolicyError(f"endpoint rejected the request with HTTP {response.status_code}: {one_line(response.text)}")


def _finish(reason: str | None) -> str | None:
    return {"stop": "eos", "length": "length", "tool_calls": "eos"}.get(reason or "", None)


def _parse_reply(body: dict[str, Any]) -> dict[str, Any]:
    choice = body["choices"][0]
    message = choice["message"]
    text = (message.get("content") or "") + tool_calls_as_hermes(message.get("tool_calls") or [])
    return {"text": text, "finish_reason": _finish(choice.get("finish_reason")) or "eos", "usage": body.get("usage")}


def _merge_call_deltas(calls: dict[int, dict[str, Any]], deltas: list[dict[str, Any]]) -> None:
    """Streamed tool calls arrive in fragments keyed by index; join name and arguments."""
    for delta in deltas:
        call = calls.setdefault(int(delta.get("index", 0)), {"function": {"name": "", "arguments": ""}})
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""
