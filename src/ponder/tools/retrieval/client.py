"""A Retriever that asks a retrieval server over HTTP (ours or Search-R1's).

A search tool calls this in the middle of a rollout, so failures must be bounded
in time: each attempt has a timeout, transient failures (timeouts, connection
errors, 5xx) are retried with exponential backoff, and then RetrievalError is
raised for the tool to turn into an error observation.
"""

from __future__ import annotations

from typing import Any

from ponder.httpretry import one_line, post_retrying
from ponder.tools.retrieval.corpus import Hit


class RetrievalError(RuntimeError):
    """The retrieval server could not answer; the message is one line."""


def _parse_hit(item: Any) -> Hit:
    # With return_scores the server wraps each passage as {"document": …, "score": …};
    # without, the passage comes bare (score unknown, 0.0).
    if isinstance(item, dict) and isinstance(item.get("document"), dict):
        document, score = item["document"], item.get("score", 0.0)
    else:
        document, score = item, 0.0
    if not isinstance(document, dict) or "contents" not in document:
        raise ValueError(f"passage without 'contents': {one_line(repr(item), 80)}")
    return Hit(str(document.get("id", "")), str(document["contents"]), float(score))


class HttpRetriever:
    """Retriever protocol over `POST {url}/retrieve` (Search-R1's retrieval API).

    `timeout_s` bounds each attempt; `retries` extra attempts follow a timeout, a
    connection error or a 5xx answer, after waiting backoff_s, 2·backoff_s, 4·backoff_s…
    A 4xx answer or a malformed body is not retried. `api_key` (default:
    $PONDER_RETRIEVER_API_KEY) is sent as a bearer token, for a server started with one.
    """

    # httpx.Client is safe to share between threads.
    thread_safe = True

    def __init__(
        self, url: str, timeout_s: float = 5.0, retries: int = 2, backoff_s: float = 0.2, api_key: str | None = None
    ) -> None:
        import os

        import httpx

        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        api_key = api_key or os.environ.get("PONDER_RETRIEVER_API_KEY") or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fail(self, reason: str, attempts: int) -> RetrievalError:
        plural = "attempt" if attempts == 1 else "attempts"
        return RetrievalError(f"retrieval server {self.url} {reason} after {attempts} {plural}")

    def _post(self, payload: dict[str, Any]) -> Any:
        response = post_retrying(self._client, f"{self.url}/retrieve", payload, self.retries, self.backoff_s,
                                 self._fail)  # fmt: skip
        try:
            return response.json()
        except ValueError as exc:
            raise self._fail(f"answered with invalid JSON ({one_line(exc)})", 1) from exc

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top `topk` passages per query from the server, best first."""
        if not queries:
            return []
        body = self._post({"queries": list(queries), "topk": topk, "return_scores": True})
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrievalError(
                f"retrieval server {self.url} answered {len(queries)} queries with a malformed result"
            )
        try:
            return [[_parse_hit(item) for item in ranking] for ranking in result]
        except (TypeError, ValueError) as exc:
            raise RetrievalError(f"retrieval server {self.url} answered a malformed passage ({exc})") from exc
