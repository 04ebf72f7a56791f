"""The one registry class: a shadowing name is refused, an unknown one lists the
valid names in one line, traits replace branches on names, and every registry of
the package is an instance of it."""

from __future__ import annotations

import pytest

from ponder.registry import Registry


def double(x):
    return 2 * x


def test_a_second_object_under_a_taken_name_is_refused():
    reg: Registry = Registry("thing")
    reg.register("a")(len)
    reg.add("a", len)  # the same object again is fine
    with pytest.raises(ValueError, match=r"^thing 'a' is already registered \(by builtins.len\); pick another name$"):
        reg.register("a")(abs)
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", lambda x: x)
    assert reg.get("a") is len and reg.names() == ["a"] and len(reg) == 1


def test_a_reloaded_definition_is_the_same_entry():
    reg: Registry = Registry("thing")
    reg.add("d", double)
    namespace: dict = {"__name__": __name__}
    exec("def double(x):\n    return x + x\n", namespace)  # noqa: S102 (the module's source run again)
    reg.add("d", namespace["double"])
    assert reg.get("d") is namespace["double"]
    with pytest.raises(ValueError, match="already registered"):  # two lambdas are two definitions
        reg.add("l", lambda: 1) or reg.add("l", lambda: 2)
    reg.add("s", "a description " + "of it")
    reg.add("s", "a description of it")  # equal plain data: the same entry
    with pytest.raises(ValueError, match="already registered"):
        reg.add("s", "another description")


def test_an_unknown_name_lists_the_valid_ones_in_one_line():
    reg: Registry = Registry("widget")
    for name in ("b", "a", "c"):
        reg.add(name, name)
    with pytest.raises(ValueError) as err:
        reg.get("z")
    assert str(err.value) == "unknown widget 'z'; valid: a, b, c"
    with pytest.raises(ValueError) as err:
        reg.check("z", where="section.key")
    assert str(err.value) == "section.key: unknown widget 'z'; valid: a, b, c"
    assert str(reg.error("z", also="'module:attribute'")) == "unknown widget 'z'; valid: a, b, c, or 'module:attribute'"
    assert list(reg) == ["a", "b", "c"] and "a" in reg and "z" not in reg


def test_traits_have_declared_defaults_and_refuse_an_undeclared_one():
    reg: Registry = Registry("estimator", traits={"needs_values": False})
    reg.register("gae", needs_values=True)(double)
    reg.add("plain", len)
    assert reg.trait("gae", "needs_values") is True and reg.trait("plain", "needs_values") is False
    with pytest.raises(ValueError, match=r"estimator 'x': unknown trait\(s\) \['needs_value'\]; declared: needs_values"):
        reg.add("x", abs, needs_value=True)
    assert "x" not in reg
    with pytest.raises(KeyError, match="declare no trait 'colour'"):
        reg.trait("gae", "colour")
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        reg.trait("nope", "needs_values")
