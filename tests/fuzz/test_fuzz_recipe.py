"""`load_recipe` on any YAML text and any overrides: a Recipe (AgentConfig), or one line
of ConfigError naming the file or the override, never another exception, never a hang."""

import dataclasses
import tempfile
import typing
from pathlib import Path

import yaml
from hypothesis import strategies as st

from ponder.agent.config import AgentConfig, AgentConfigError
from ponder.config import ConfigError, Recipe, load_recipe

from .conftest import ANY_TEXT, deep_nesting, fuzz_pair, one_line_error


def key_paths(cls, prefix="") -> list[str]:
    """Every dotted key of a config dataclass, sections included."""
    paths = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        path = prefix + field.name
        paths.append(path)
        if dataclasses.is_dataclass(hints[field.name]):
            paths += key_paths(hints[field.name], path + ".")
    return paths


KEYS = key_paths(Recipe) + key_paths(AgentConfig)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), ANY_TEXT,
    st.sampled_from([0, -1, 1, 2**70, 1e400, float("nan"), "1e-3", ".inf", "hermes", "bm25", "grpo", ""]),
)  # fmt: skip
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
                      max_leaves=8)  # fmt: skip


def nested(pairs: list[tuple[str, object]]) -> dict:
    """{"a.b": v} pairs as a nested mapping (a later pair wins where paths collide)."""
    root: dict = {}
    for dotted, value in pairs:
        node = root
        *parents, last = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return root


STRUCTURED = st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=8).map(
    lambda pairs: yaml.safe_dump(nested(pairs), allow_unicode=True)
)
YAML_PIECES = [
    "rollout:", "\n  batch_size: ", "sampling:", "\n    temperature: ", "train:\n  steps: ", "- ", "? ", ": ",
    "&a ", "*a", "[", "]", "{", "}", ",", "!!python/object:os.system", "!!binary ", "!!float ", "%YAML 1.2\n",
    "---\n", "...\n", "|\n", ">\n", "'", '"', "#", "\t", "\n", "  ", "1e400", "0x1F", "0o17", ".nan", "~",
    "9" * 5000, "<<: *a", "\ufeff", "\x00", "\ud800",
]  # fmt: skip
SOUP = st.lists(st.one_of(st.sampled_from(YAML_PIECES), st.sampled_from(KEYS), ANY_TEXT), max_size=40).map("".join)
BOMB = st.integers(1, 30).map(
    lambda n: "a0: &a0 [x, x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, n))
)
DEEP = st.one_of(deep_nesting("["), deep_nesting("- "), deep_nesting("{a: ", "}"),
                 st.integers(0, 3000).map(lambda n: "".join(f"{' ' * i}k{i}:\n" for i in range(n))))  # fmt: skip
RECIPE_TEXT = st.one_of(STRUCTURED, SOUP, BOMB, DEEP, ANY_TEXT)
OVERRIDE = st.one_of(
    st.builds(lambda key, value: f"{key}={value}", st.sampled_from(KEYS), st.one_of(ANY_TEXT, st.sampled_from(YAML_PIECES))),
    ANY_TEXT,
)  # fmt: skip


def check_load(example: tuple[str, list[str], type]) -> None:
    text, overrides, cls = example
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            config = load_recipe(path, overrides, cls=cls)
        except (ConfigError, AgentConfigError) as err:
            one_line_error(str(err))
            assert str(err).startswith(str(path)), str(err)  # names the file (overrides: "file (override)")
            return
    assert isinstance(config, cls)


EXAMPLES = st.tuples(RECIPE_TEXT, st.lists(OVERRIDE, max_size=3), st.sampled_from([Recipe, AgentConfig]))
test_load_recipe, test_load_recipe_deep = fuzz_pair(EXAMPLES, check_load, fast=300)
