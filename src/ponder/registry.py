"""The one name → object registry of ponder: environments, reward components,
built-in tools, parsers, generation backends, trackers, LR schedules, data styles,
selection strategies, merge methods, and the algorithms (advantages, losses,
aggregations, KL estimators and references, filters, curricula, preference losses).

A leaf module (it imports nothing of ponder), so every layer registers the same way,
`ponder.types` and `ponder.algos` included. Callers look entries up by the name in
the config and never branch on it: what an entry differs in that its caller must
know (GAE needs a value head, IPO averages log-probs) is a **trait** declared with
the registry and given at registration, read with `trait(name, key)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects (functions, classes, builders) of one kind.

    kind: what is registered ("advantage estimator", "environment", …), so an unknown
    name fails with a one-line message a user can act on:
    ``unknown advantage estimator 'x'; valid: gae, grpo, rloo`` (with `where`, the
    recipe key that named it, in front: ``algo.advantage: unknown …``).
    traits: the attributes an entry may declare, with their defaults
    (``{"needs_values": False}``); an undeclared one is refused at registration.

    A name is registered once: a second, different object under a taken name raises
    (two plug-ins cannot silently shadow each other). The same object again, equal
    plain data, or the same definition re-executed (a reloaded module: same module
    and qualified name; never two lambdas) is accepted.
    """

    def __init__(self, kind: str, traits: Mapping[str, Any] | None = None) -> None:
        self.kind = kind
        self.defaults: dict[str, Any] = dict(traits or {})
        self._items: dict[str, T] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **traits: Any) -> Callable[[T], T]:
        """Decorator: ``@REG.register("name", trait=value)``."""

        def decorator(item: T) -> T:
            self.add(name, item, **traits)
            return item

        return decorator

    def add(self, name: str, item: T, **traits: Any) -> None:
        """Register `item` under `name` (the non-decorator form)."""
        undeclared = sorted(set(traits) - set(self.defaults))
        if undeclared:
            declared = ", ".join(sorted(self.defaults)) or "none"
            raise ValueError(f"{self.kind} '{name}': unknown trait(s) {undeclared}; declared: {declared}")
        if name in self._items and not _same_definition(self._items[name], item):
            raise ValueError(f"{self.kind} '{name}' is already registered ({_origin(self._items[name])}); "
                             "pick another name")  # fmt: skip
        self._items[name] = item
        self._traits[name] = {**self.defaults, **traits}

    def get(self, name: str, where: str | None = None) -> T:
        """The object registered as `name`; ValueError listing the valid names otherwise."""
        if name not in self._items:
            raise self.error(name, where)
        return self._items[name]

    def check(self, name: str, where: str | None = None) -> None:
        """Raise (like `get`) unless `name` is registered: for failing before any work."""
        self.get(name, where)

    def trait(self, name: str, key: str) -> Any:
        """The trait `key` of the entry `name` (its declared default unless it set one)."""
        if key not in self.defaults:
            raise KeyError(f"{self.kind}s declare no trait {key!r}; declared: {', '.join(sorted(self.defaults))}")
        self.get(name)
        return self._traits[name][key]

    def error(self, name: str, where: str | None = None, also: str | None = None) -> ValueError:
        """The one-line error for an unknown `name` (`also`: another accepted form)."""
        prefix = f"{where}: " if where else ""
        valid = ", ".join(self.names()) + (f", or {also}" if also else "")
        return ValueError(f"{prefix}unknown {self.kind} '{name}'; valid: {valid}")

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def _same_definition(old: object, new: object) -> bool:
    if old is new or (isinstance(old, (str, bytes, int, float, tuple)) and type(old) is type(new) and old == new):
        return True  # the same object, or equal plain data (a description)
    module, qualname = getattr(old, "__module__", None), getattr(old, "__qualname__", None)
    if module is None or qualname is None or "<lambda>" in qualname:
        return False
    return (getattr(new, "__module__", None), getattr(new, "__qualname__", None)) == (module, qualname)


def _origin(item: object) -> str:
    module, name = getattr(item, "__module__", None), getattr(item, "__qualname__", None)
    return f"by {module}.{name}" if module and name else f"as {item!r}"[:120]
