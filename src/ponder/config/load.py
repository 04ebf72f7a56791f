"""Recipes from YAML: parse (depth-bounded, YAML 1.2 floats, duplicate keys refused),
apply `a.b.c=value` overrides, build the dataclasses of ponder.config.sections rejecting
unknown keys and wrong types, then check value ranges. Every error is a one-line
ConfigError naming the file and the dotted key (and, for a duplicate key, the line).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ponder.config.sections import EnvConfig, Recipe, RewardConfig

class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names one key twice (PyYAML would silently keep the last value)."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(problem=f"duplicate key {key!r}")
        self.key, self.line, self.first = key, line, first


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads YAML 1.2 floats such as `1e-3` (YAML 1.1 reads them as text)
    and refuses a mapping that names one key twice (DuplicateKeyError)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges; a merged key that is set again is an override
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKeyError(key, line, seen[key])
            except TypeError:  # an unhashable key: SafeLoader refuses it below
                continue
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


# Characters str.splitlines() breaks at: an error message quoting a key or value that holds
# one must still print as one line.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}
_MAX_MESSAGE_CHARS = 500


class ConfigError(ValueError):
    """A recipe or override is wrong; the message names the file and key.

    The message is one line whatever it quotes: line breaks and lone surrogates are
    escaped, and it is cut at 500 characters."""

    def __init__(self, message: str) -> None:
        text = message.translate(_LINE_BREAKS).encode("utf-8", "backslashreplace").decode("utf-8")
        if len(text) > _MAX_MESSAGE_CHARS:
            text = text[: _MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(text)



T = TypeVar("T")

# Keys that moved out of the core sections into an environment's own options or the
# generic weights: (section class, old key) → (new key, why). A recipe that still
# writes one is refused with one line naming the new key, never read another way.
_SEARCH_QA_OPTION = "search-QA's own option, read by env.kind search_qa"
_SEARCH_QA_WEIGHT = "search-QA's default weights are its environment's; reward.terms sets any component's"
MOVED: dict[tuple[type, str], tuple[str, str]] = {
    **{(EnvConfig, key): (f"env.options.{key}", _SEARCH_QA_OPTION)
       for key in ("corpus", "tasks", "taskgen", "max_obs_tokens", "max_invalid_actions")},
    (Recipe, "retriever"): ("env.options.retriever", _SEARCH_QA_OPTION),
    **{(RewardConfig, key): (f"reward.terms.{key}", _SEARCH_QA_WEIGHT)
       for key in ("em", "f1", "format", "search_cost")},
}  # fmt: skip


def _moved(cls: type, key: str) -> tuple[str, str] | None:
    """Where `key` of section `cls` (or of a section it extends) went, if it moved."""
    return next((MOVED[(base, key)] for base in cls.__mro__ if (base, key) in MOVED), None)


def from_dict(cls: type[T], data: dict[str, Any], source: str = "<config>", prefix: str = "") -> T:
    """Build a config dataclass from a nested dict, rejecting unknown keys and bad types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix.rstrip('.') or '<root>'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            moved = _moved(cls, key)
            if moved is not None:
                raise ConfigError(f"{source}: key '{prefix}{key}' moved to '{moved[0]}' ({moved[1]})")
            raise ConfigError(f"{source}: unknown key '{prefix}{key}' (valid: {', '.join(sorted(names))})")
        kwargs[key] = _coerce(hints[key], value, source, f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as err:  # a config class's own check (e.g. AgentConfig.__post_init__)
        where = f" '{prefix.rstrip('.')}'" if prefix else ""
        raise ConfigError(f"{source}:{where} {str(err).splitlines()[0] if str(err) else type(err).__name__}") from err


def _coerce(hint: Any, value: Any, source: str, key: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value if value is not None else {}, source, key + ".")
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    if value is None and type(None) in options:
        return None
    for option in options:
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option in (int, str, bool) and type(value) is option:
            return value
        if option in (list, dict) and isinstance(value, option):
            return value
        if typing.get_origin(option) in (list, dict) and isinstance(value, typing.get_origin(option)):
            return value
    expected = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    raise ConfigError(f"{source}: key '{key}' expects {expected}, got {value!r}")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def to_dict(config: Any) -> dict[str, Any]:
    """The config as a plain nested dict (for saving next to a run)."""
    return dataclasses.asdict(config)


def save_recipe(recipe: Any, path: str | Path) -> None:
    """The recipe as YAML at `path` (a run's recipe.yaml), written atomically."""
    from ponder.fileio import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(to_dict(recipe), sort_keys=False))


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "override") -> dict[str, Any]:
    """Apply `a.b.c=value` strings to a nested dict; values parse as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: '{item}' is not key=value")
        dotted, raw = item.split("=", 1)
        value = _parse_yaml(raw, f"{source}: '{item[:80]}'")
        node = data
        parts = dotted.strip().split(".")
        for part in parts[:-1]:
            if node.get(part) is None:  # `rollout:` with every child commented out
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: '{dotted}' goes through a non-mapping key '{part}'")
        node[parts[-1]] = value
    return data


# Deeper YAML is refused before PyYAML's recursive composer sees it: a RecursionError
# there can surface as another exception (IndexError) from the middle of its reader.
MAX_YAML_DEPTH = 64


def _parse_yaml(text: str, where: str) -> Any:
    """YAML text as data, or ConfigError naming `where`. PyYAML raises more than YAMLError:
    RecursionError on deep nesting, ValueError on integers past Python's digit limit, and
    its constructors IndexError, ValueError … on malformed tagged scalars (`!!float ''`)."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_Loader):  # an iterative state machine: no recursion
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ConfigError(f"{where}: YAML nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_Loader)
    except ConfigError:
        raise
    except DuplicateKeyError as err:
        raise ConfigError(f"{where}:{err.line}: duplicate key '{err.key}' (first at line {err.first})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from err
    except RecursionError:
        raise ConfigError(f"{where}: not valid YAML (nested too deeply)") from None
    except Exception as err:  # noqa: BLE001 - see the docstring
        raise ConfigError(f"{where}: not valid YAML ({type(err).__name__}: {str(err).split(':')[0]})") from None


def packaged_recipes() -> Path:
    """The directory of recipes shipped inside the package (`recipes/` in the repository)."""
    return Path(__file__).resolve().parent.parent / "recipes"


def resolve_recipe_path(path: str | Path) -> Path:
    """`path` when it exists; else, for a relative path, the packaged recipe of that name."""
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("recipes",) else path.parts
    shipped = packaged_recipes().joinpath(*parts) if parts else None
    return shipped if shipped is not None and shipped.is_file() else path


def load_recipe(path: str | Path | None, overrides: list[str] | None = None, cls: type[T] = Recipe) -> T:  # type: ignore[assignment]
    """Load a YAML recipe into `cls`, apply overrides, validate every key.

    A relative path that does not exist from the working directory is looked up
    among the recipes shipped with ponder (`recipes/demo.yaml` or `demo.yaml`)."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path:
        path = resolve_recipe_path(path)
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"{path}: cannot read recipe ({err.strerror})") from err
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path}: recipe is not UTF-8 text") from err
        data = _parse_yaml(text, str(path)) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    data = apply_overrides(data, overrides or [], source=f"{source} (override)")
    config = from_dict(cls, data, source)
    check_ranges(config, source)
    return config


def _at_least(low: float) -> tuple[str, Any]:
    return f">= {low:g}", lambda v: v >= low


def _between(low: float, high: float, open_low: bool = False) -> tuple[str, Any]:
    text = f"in {'(' if open_low else '['}{low:g}, {high:g}]"
    return text, lambda v: (v > low if open_low else v >= low) and v <= high


# Value ranges checked when a recipe loads (a zero batch or step count would divide
# by zero or hang much later): dotted key → (what it must be, test).
RANGES: dict[str, tuple[str, Any]] = {
    **{key: _at_least(1) for key in (
        "rollout.batch_size", "rollout.group_size", "rollout.sampling.max_new_tokens_per_turn",
        "rollout.sampling.max_total_tokens", "env.max_turns",
        "train.tasks_per_step", "train.save_every", "sft.batch_size", "eval.episodes", "algo.epochs",
        "algo.micro_batch_size", "lora.r", "train.ray_workers",
    )},  # fmt: skip
    **{key: _at_least(0) for key in (
        "rollout.sampling.temperature", "eval.temperature", "eval.batch_size",
        "train.steps", "train.eval_every", "train.eval_episodes", "sft.steps", "sft.examples", "optim.lr",
        "optim.warmup_steps", "optim.max_grad_norm", "algo.mini_batch_size", "algo.logprob_micro_batch_size",
        "algo.clip_low", "algo.clip_high", "algo.kl_coef", "selection.target_size", "dpo.steps",
        "sft_trainer.steps", "dpo.rpo_alpha", "train.stop_grace_s", "algo.max_refills",
        "tracking.samples_every", "tracking.samples", "train.val_tasks", "train.patience",
        "algo.max_staleness", "train.ray_env_workers",
    )},  # fmt: skip
    "rollout.sampling.top_p": _between(0, 1, open_low=True),
    "algo.gamma": _between(0, 1),
    "train.curriculum_floor": _between(0, 1),
    "train.curriculum_momentum": _between(0, 1),
    "algo.lam": _between(0, 1),
}


def check_ranges(config: Any, source: str = "<config>") -> None:
    """Raise ConfigError naming the first key whose value is out of its range (RANGES);
    keys a config does not have are skipped."""
    for key, (expected, test) in RANGES.items():
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not test(value):
            raise ConfigError(f"{source}: key '{key}' must be {expected}, got {value!r}")
