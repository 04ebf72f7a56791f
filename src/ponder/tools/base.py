"""Tools as the model sees them: a ToolSpec (name, description, JSON Schema) plus code.

`@tool` turns a typed, Google-style-docstring'd function into a `Tool`; the schema
comes from the type hints and the argument descriptions from the docstring, so the
text the model reads and the code that runs cannot drift apart. Tools that keep
state between calls (a sandbox, a browser, a database connection) subclass
`StatefulTool`: the registry creates one handle per registry on first use and
releases it on `registry.close()`.
"""

from __future__ import annotations

import abc
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from ponder.types import ToolSpec

# The OpenAI and HF chat templates accept only these characters in function names.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PRIMITIVE_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters)\s*:\s*$")
_SECTION_HEADER = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
# "name: text", "name (type): text" or "name (type, optional): text"
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


_ISOLATION_MODES = ("process", "thread")


class Tool:
    """A plain function the model may call, with the spec it is shown.

    isolation: how a call is stopped at its limit (see ponder.tools.isolation):
        "process" (a forked child, killed at the limit: for tools that may block or spin
        in C, or must not be left half-run), "thread" (in this process, stopped at its
        next Python instruction), or None for the registry's choice ("thread" by default).
    idempotent: a call that timed out may be retried (it may have half-run: a retry
        of a non-idempotent tool could repeat its side effect, so it is not retried).
    """

    def __init__(
        self, spec: ToolSpec, fn: Callable[..., Any], timeout_s: float | None = None,
        isolation: str | None = None, idempotent: bool = False,
    ) -> None:  # fmt: skip
        if not _TOOL_NAME.match(spec.name):
            raise ValueError(f"tool name {spec.name!r} must match {_TOOL_NAME.pattern}")
        if isolation is not None and isolation not in _ISOLATION_MODES:
            raise ValueError(f"tool {spec.name!r}: isolation must be one of {_ISOLATION_MODES} or None")
        self.spec = spec
        self.fn = fn
        self.timeout_s = timeout_s
        self.isolation = isolation
        self.idempotent = idempotent

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, **kwargs: Any) -> Any:
        return self.fn(**kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, timeout_s={self.timeout_s!r}, isolation={self.isolation!r})"


class StatefulTool(abc.ABC):
    """A tool whose calls share a handle that must be created and released.

    Subclasses implement `create` and `call` (and `release` when the handle holds
    resources). The spec is built from `call`'s signature and docstring, without
    its first (handle) parameter, unless one is passed in; the name defaults to the
    class name in snake_case. The registry creates the
    handle lazily, once per registry, so building a registry per episode gives
    each episode its own state. Calls run in this process (isolation "thread"),
    where the handle lives; a call that timed out drops its handle (the next call
    gets a fresh one) and is retried only when `idempotent`.
    """

    isolation = "thread"

    def __init__(
        self, name: str | None = None, timeout_s: float | None = None, spec: ToolSpec | None = None,
        idempotent: bool = False,
    ) -> None:  # fmt: skip
        if spec is None:
            handle_param = next(iter(inspect.signature(self.call).parameters))
            spec = spec_from_function(self.call, name=name or _snake_case(type(self).__name__), skip=(handle_param,))
        elif name is not None and name != spec.name:
            raise ValueError(f"name {name!r} disagrees with spec name {spec.name!r}")
        if not _TOOL_NAME.match(spec.name):
            raise ValueError(f"tool name {spec.name!r} must match {_TOOL_NAME.pattern}")
        self.spec = spec
        self.timeout_s = timeout_s
        self.idempotent = idempotent

    @property
    def name(self) -> str:
        return self.spec.name

    @abc.abstractmethod
    def create(self, **kwargs: Any) -> Any:
        """Build the per-registry state the calls will share; return it as the handle."""

    @abc.abstractmethod
    def call(self, handle: Any, **arguments: Any) -> Any:
        """Run one call against the handle; the result is shown to the model."""

    def release(self, handle: Any) -> None:
        """Free what `create` acquired. Handles that hold only Python objects need nothing."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, timeout_s={self.timeout_s!r})"


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, timeout_s: float | None = None,
    isolation: str | None = None, idempotent: bool = False,
) -> Any:  # fmt: skip
    """Make a Tool from a typed function with a Google-style docstring.

    Usable bare (`@tool`) or with options (`@tool(name="search", timeout_s=5,
    isolation="thread", idempotent=True)`; see Tool for what they mean).
    Raises TypeError at decoration time when a parameter lacks a type hint or a
    docstring description, so a tool the model cannot understand never registers.
    """

    def build(function: Callable[..., Any]) -> Tool:
        spec = spec_from_function(function, name=name)
        return Tool(spec, _fill_optional_none(function), timeout_s, isolation, idempotent)

    if fn is not None:
        return build(fn)
    return build


def spec_from_function(fn: Callable[..., Any], name: str | None = None, skip: tuple[str, ...] = ()) -> ToolSpec:
    """The ToolSpec of `fn`: description and argument schema from its docstring and hints.

    `skip` names parameters the model does not supply (a stateful tool's handle).
    """
    label = getattr(fn, "__qualname__", None) or repr(fn)
    description, arg_docs = parse_google_docstring(inspect.getdoc(fn) or "", label)
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name in skip:
            continue
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"tool {label}: parameter {param.name!r} must be passable by keyword (no *args/**kwargs)")
        if param.name not in hints:
            raise TypeError(f"tool {label}: parameter {param.name!r} has no type hint")
        if not arg_docs.get(param.name):
            raise TypeError(f"tool {label}: parameter {param.name!r} is not described in the docstring's Args section")
        annotation = hints[param.name]
        schema = json_schema_for(_without_none(annotation), f"{label}.{param.name}")
        properties[param.name] = {**schema, "description": arg_docs[param.name]}
        if param.default is inspect.Parameter.empty and not _allows_none(annotation):
            required.append(param.name)
    unknown = sorted(set(arg_docs) - set(properties) - set(skip))
    if unknown:
        raise TypeError(f"tool {label}: docstring describes {', '.join(map(repr, unknown))}, not parameters of it")
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return ToolSpec(name=name or fn.__name__, description=description, parameters=parameters)


def parse_google_docstring(doc: str, label: str = "function") -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) from a Google-style docstring.

    The description is the first paragraph, joined onto one line. Continuation
    lines of an argument (indented deeper than its name) join its description.
    """
    lines = inspect.cleandoc(doc).splitlines()
    if not lines or not lines[0].strip():
        raise TypeError(f"tool {label} has no docstring; its first paragraph is the description the model reads")
    paragraph: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION_HEADER.match(line):
            break
        paragraph.append(line.strip())
    header = next((i for i, line in enumerate(lines) if _ARGS_HEADER.match(line)), None)
    arg_docs = {} if header is None else _parse_args_section(lines[header + 1 :])
    return " ".join(paragraph), arg_docs


def _parse_args_section(lines: list[str]) -> dict[str, str]:
    arg_docs: dict[str, str] = {}
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break  # the next section ("Returns:", "Raises:") starts at the left margin
        entry_indent = indent if entry_indent is None else entry_indent
        match = _ARG_LINE.match(line.strip())
        if indent == entry_indent and match:
            current = match.group(1)
            arg_docs[current] = match.group(2).strip()
        elif current is not None:
            arg_docs[current] = f"{arg_docs[current]} {line.strip()}".strip()
    return arg_docs


def json_schema_for(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of one type hint; TypeError for hints JSON cannot carry."""
    if annotation in _PRIMITIVE_TYPES:
        return {"type": _PRIMITIVE_TYPES[annotation]}
    if annotation is Any:
        return {}
    if annotation is type(None):
        return {"type": "null"}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is list or origin is list:
        return {"type": "array", "items": json_schema_for(args[0], where)} if args else {"type": "array"}
    if annotation is dict or origin is dict:
        if len(args) == 2 and args[1] is not Any:
            return {"type": "object", "additionalProperties": json_schema_for(args[1], where)}
        return {"type": "object"}
    if origin is Literal:
        return _literal_schema(list(args), where)
    if origin is Union or origin is types.UnionType:
        options = [json_schema_for(arg, where) for arg in args]
        if all(set(option) == {"type"} for option in options):
            return {"type": [option["type"] for option in options]}
        return {"anyOf": options}
    raise TypeError(f"tool {where}: type hint {annotation!r} has no JSON Schema equivalent")


def _literal_schema(values: list[Any], where: str) -> dict[str, Any]:
    value_types = {type(value) for value in values}
    if not value_types <= set(_PRIMITIVE_TYPES):
        raise TypeError(f"tool {where}: Literal values must be str, int, float or bool, got {values!r}")
    if len(value_types) == 1:
        return {"type": _PRIMITIVE_TYPES[value_types.pop()], "enum": values}
    return {"enum": values}


def _allows_none(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    return (origin is Union or origin is types.UnionType) and type(None) in typing.get_args(annotation)


def _without_none(annotation: Any) -> Any:
    """`X | None` → X: optionality is expressed by leaving the argument out of "required"."""
    if not _allows_none(annotation):
        return annotation
    rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007 - built from a runtime tuple


def _fill_optional_none(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Pass None for `x: T | None` parameters without a default when the model omits them.

    The schema marks such parameters optional, so a call without them is valid and
    must not fail with Python's "missing required argument".
    """
    hints = typing.get_type_hints(fn)
    missing_default = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty and p.name in hints and _allows_none(hints[p.name])
    ]
    if not missing_default:
        return fn

    @functools.wraps(fn)
    def with_none_defaults(**kwargs: Any) -> Any:
        return fn(**{**dict.fromkeys(missing_default), **kwargs})

    return with_none_defaults


def _snake_case(class_name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", class_name).lower()
