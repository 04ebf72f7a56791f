"""Errors the server answers with, in OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}` and the HTTP status that goes with it.

Every bad request gets one of these with a one-line message naming the problem, so a
client (the `openai` SDK raises `BadRequestError`, `NotFoundError` … from them) can
tell the user what to fix.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An answer other than 200: status, one-line message, OpenAI's `type` and `code`."""

    def __init__(
        self, status: int, message: str, code: str, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())
        self.code = code
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, code, param=param)


def model_output_error(message: str, code: str) -> APIError:
    """The model did not produce what the request demanded (a valid tool call, JSON that
    matches the schema) within the attempts allowed. 422, not 5xx: the server worked,
    and OpenAI's SDKs retry every 5xx, which would only repeat a deterministic failure."""
    return APIError(422, message, code, kind="model_output_error")
