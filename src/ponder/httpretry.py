"""POST with bounded retries, shared by ponder's HTTP clients (the retrieval client,
the vLLM server client): timeouts, transport errors and 5xx answers are transient and
retried with exponential backoff; a 4xx answer is the request's fault and is not.
Imports nothing of ponder."""

from __future__ import annotations

import time
from typing import Any, Callable


def one_line(text: Any, limit: int = 200) -> str:
    """`text` flattened to one line of at most `limit` characters (for error messages)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def post_retrying(
    client: Any, url: str, payload: Any, retries: int, backoff_s: float, fail: Callable[[str, int], Exception],
    *, timed_out: str = "timed out", rejected: str = "rejected the request", before: Callable[[], None] | None = None,
) -> Any:  # fmt: skip
    """POST `payload` as JSON with `client` (an httpx.Client) until the server answers
    below 500, waiting backoff_s, 2·backoff_s, … between attempts; returns that response.

    fail(reason, attempts) builds the exception raised on a 4xx answer (with the
    attempts made so far) or once retries + 1 attempts are spent (with the last
    reason: `timed_out`, "could not be reached (…)" or "answered HTTP 5xx (…)").
    before() runs before every attempt (e.g. to raise when a child server died).
    """
    import httpx

    reason = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        if before is not None:
            before()
        try:
            response = client.post(url, json=payload)
        except httpx.TimeoutException:
            reason = timed_out
            continue
        except httpx.TransportError as exc:
            reason = f"could not be reached ({type(exc).__name__}: {one_line(exc)})"
            continue
        if response.status_code >= 500:
            reason = f"answered HTTP {response.status_code} ({one_line(response.text)})"
            continue
        if response.status_code >= 400:
            raise fail(f"{rejected} with HTTP {response.status_code} ({one_line(response.text)})", attempt + 1)
        return response
    raise fail(reason, retries + 1)
