"""The request bodies the server accepts, as pydantic models of OpenAI's API.

`user` picks that user's adapter when the server keeps per-user adapters (--users,
serve/users.py) and is otherwise ignored. Fields ponder does not act on (`seed`,
`frequency_penalty` …) are accepted and ignored, as other OpenAI-compatible servers
do, so stock clients work unchanged;
`logprobs` and non-text content parts are refused (400) rather than silently dropped.
`parse_request` turns a decoded JSON body into a model or an APIError whose message
names the first offending field.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar, Union

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ponder.serve.errors import APIError, bad_request

# OpenAI's rule for function names; a name outside it could not be called back anyway.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STOP = 4  # OpenAI's limit on stop sequences


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class FunctionDef(_Lenient):
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Lenient):
    type: Literal["function"]
    function: FunctionDef


class CallFunction(_Lenient):
    name: str
    arguments: Union[str, dict[str, Any]] = ""


class MessageToolCall(_Lenient):
    id: str = ""
    type: str = "function"
    function: CallFunction


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Lenient):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Lenient):
    include_usage: bool = False


class _Sampling(_Lenient):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    logprobs: Any = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    prompt_logprobs: int | None = None  # vLLM's: the prompt tokens' logprobs, with the top K (serve/scoring.py)


Request = TypeVar("Request", bound=_Sampling)


def parse_request(body: Any, model: type[Request]) -> Request:
    """`body` (decoded JSON) as `model`, checked; APIError 400 naming the first problem."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = model.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise bad_request(f"{where}: {first['msg']}", param=where) from None
    if request.logprobs not in (None, False, 0):
        raise bad_request("logprobs are not supported by ponder serve", param="logprobs")
    stops = stop_list(request.stop)
    if len(stops) > MAX_STOP:
        raise bad_request(f"stop: at most {MAX_STOP} sequences, got {len(stops)}", param="stop")
    if isinstance(request, ChatRequest):
        check_tools(request)
        check_response_format(request.response_format)
    return request


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [s for s in ([stop] if isinstance(stop, str) else stop) if s]


def check_schema(schema: Any, where: str) -> None:
    """APIError 400 unless `schema` is a valid JSON Schema (its own $schema's draft,
    else 2020-12)."""
    if not isinstance(schema, dict):
        raise bad_request(f"{where} must be a JSON Schema object", param=where)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        path = "/".join(str(p) for p in err.path) or "(root)"
        raise bad_request(f"{where} is not a valid JSON Schema: {err.message} at {path}", param=where) from None


def check_tools(request: ChatRequest) -> None:
    tools = request.tools or []
    names = []
    for index, tool in enumerate(tools):
        name = tool.function.name
        if not _TOOL_NAME.match(name):
            raise bad_request(f"tools[{index}].function.name {name!r}: use 1-64 letters, digits, _ or -",
                              param=f"tools[{index}].function.name")  # fmt: skip
        if name in names:
            raise bad_request(f"tools[{index}]: a second tool named {name!r}", param=f"tools[{index}]")
        names.append(name)
        if tool.function.parameters is not None:
            check_schema(tool.function.parameters, f"tools[{index}].function.parameters")
    choice = request.tool_choice
    if choice not in (None, "none", "auto") and not tools:
        raise bad_request("tool_choice requires tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad_request(f"tool_choice names {choice.function.name!r}, which is not among the tools "
                          f"({', '.join(names)})", param="tool_choice")  # fmt: skip


def check_response_format(response_format: ResponseFormat | None) -> None:
    if response_format is None or response_format.type != "json_schema":
        return
    if response_format.json_schema is None or not response_format.json_schema.schema_:
        raise bad_request("response_format json_schema needs json_schema.schema", param="response_format")
    check_schema(response_format.json_schema.schema_, "response_format.json_schema.schema")


def forced_tool(request: ChatRequest) -> str | None:
    """`required`, the name of the tool the request forces, or None (the model chooses)."""
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        return choice.function.name
    return "required" if choice == "required" else None


def max_tokens_of(request: ChatRequest | CompletionRequest) -> int | None:
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        return request.max_completion_tokens
    return request.max_tokens


def api_error_from(exc: Exception) -> APIError:
    return exc if isinstance(exc, APIError) else APIError(500, f"{type(exc).__name__}: {exc}", "internal_error",
                                                          kind="server_error")  # fmt: skip
