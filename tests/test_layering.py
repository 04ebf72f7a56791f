"""The dependency rules of docs/design/architecture.md, for the whole package: every
"never" is a rule here, read from the imports of every module under src/ponder
(lazy imports inside functions included). `violations` is a pure function of a
module graph, so the rules are also tested on a synthetic graph that breaks them."""

from __future__ import annotations

import ast
from pathlib import Path

import ponder

SRC = Path(ponder.__file__).parent
# Leaf helpers any layer may use: optional-dependency imports (ponder.extras), atomic file
# writes, HTTP retries, import paths, and the one name registry (a leaf, so that algos,
# which may import only types, and the layers above it register the same way).
LEAVES = ("ponder.extras", "ponder.fileio", "ponder.httpretry", "ponder.plugins", "ponder.registry")
TOP = ("ponder.train", "ponder.jobs", "ponder.serve", "ponder.cli", "ponder.wiring")
# The environment protocol; every other module under ponder.envs is a particular one.
ENV_PROTOCOL = ("ponder.envs.base",)
# (importer, what it may import only) and (importer, what it must never import).
ONLY = {
    "ponder.types": ("ponder.types", *LEAVES),
    "ponder.config": ("ponder.config", *LEAVES),
    "ponder.algos": ("ponder.algos", "ponder.types", "ponder.registry"),
    "ponder.bfcl": ("ponder.bfcl", "ponder.types", "ponder.tools", *LEAVES),
    # the estimate reads recipes, model configs (no weights) and run logs; it trains and runs nothing
    "ponder.estimate": ("ponder.estimate", "ponder.types", "ponder.config", "ponder.models", "ponder.runlog",
                        *LEAVES),
    **{leaf: (leaf,) for leaf in LEAVES},  # a leaf imports nothing of ponder
}
NEVER = {
    "ponder.tools": TOP,
    "ponder.models": TOP,
    "ponder.rewards": (*TOP, "ponder.eval", "ponder.envs", "ponder.rollout", "ponder.models"),
    "ponder.envs": (*TOP, "ponder.eval"),
    "ponder.rollout": (*TOP, "ponder.envs."),
    "ponder.agent": ("ponder.train", "ponder.jobs", "ponder.cli"),
    "ponder.train": ("ponder.envs.", "ponder.jobs", "ponder.serve", "ponder.cli", "ponder.wiring"),
    "ponder.eval": ("ponder.train", "ponder.jobs", "ponder.serve", "ponder.cli"),
    "ponder.runlog": ("ponder.train", "ponder.eval", "ponder.jobs", "ponder.serve", "ponder.cli"),
    "ponder.wiring": ("ponder.train", "ponder.jobs", "ponder.serve", "ponder.cli"),
    "ponder.serve": ("ponder.jobs", "ponder.cli"),
    "ponder.jobs": ("ponder.cli",),
    "ponder.api": ("ponder.cli",),
}
# Where a rule does not hold, and why (each one named, never a whole package).
EXCEPTIONS = {
    # Ray actors rebuild their environment and backend from the recipe in their own
    # process: a factory of environments does not pickle across processes.
    ("ponder.train.ray.rollouts", "ponder.wiring"),
    ("ponder.train.ray.env_pool", "ponder.wiring"),
}


def _within(name: str, prefix: str) -> bool:
    if prefix.endswith("."):  # "ponder.envs." = a module below the package, not the package
        return name.startswith(prefix) and not name.startswith(ENV_PROTOCOL)
    return name == prefix or name.startswith(prefix + ".")


def violations(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported` for every import that breaks a rule, sorted."""
    found = []
    for importer, imported in graph.items():
        for name in sorted(imported):
            if (importer, name) in EXCEPTIONS or not name.startswith("ponder."):
                continue
            only = [allowed for layer, allowed in ONLY.items() if _within(importer, layer)]
            if only and not any(_within(name, prefix) for prefix in only[0]):
                found.append(f"{importer} -> {name}")
            never = [banned for layer, banned in NEVER.items() if _within(importer, layer)]
            if never and any(_within(name, prefix) for prefix in never[0]):
                found.append(f"{importer} -> {name}")
            if _within(name, "ponder.cli") and not _within(importer, "ponder.cli"):
                found.append(f"{importer} -> {name}")
    return sorted(set(found))


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str) -> set[str]:
    """Every module `source` imports (relative imports resolved against `module`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            names.add(base)
            if base == "ponder":  # `from ponder import wiring` imports the module
                names.update(f"ponder.{alias.name}" for alias in node.names)
    return names


def package_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        graph[module] = {name for name in imports_of(path.read_text(), module) if name.startswith("ponder")}
    return graph


def test_the_package_keeps_every_rule():
    graph = package_graph()
    assert len(graph) > 150 and "ponder.train.rl" in graph  # the whole package was read
    assert violations(graph) == []


def test_a_broken_import_is_caught():
    graph = {
        "ponder.algos.losses": {"ponder.types", "ponder.models.lora"},  # algos reach models
        "ponder.envs.math": {"ponder.envs.base", "ponder.eval.metrics"},  # an env reads eval
        "ponder.rewards.qa": {"ponder.envs.synthetic"},  # a reward reads an env
        "ponder.rollout.engine": {"ponder.envs.base", "ponder.envs.search_qa"},  # a particular env
        "ponder.train.rl": {"ponder.train.batch", "ponder.jobs.demo", "ponder.wiring"},
        "ponder.eval.runner": {"ponder.wiring", "ponder.train.rl"},
        "ponder.serve.app": {"ponder.cli.serve"},
        "ponder.config.load": {"ponder.fileio", "ponder.types"},
        "ponder.estimate.recipe": {"ponder.config", "ponder.models.model_config", "ponder.train.optim"},
    }
    assert violations(graph) == [
        "ponder.algos.losses -> ponder.models.lora",
        "ponder.config.load -> ponder.types",
        "ponder.envs.math -> ponder.eval.metrics",
        "ponder.estimate.recipe -> ponder.train.optim",
        "ponder.eval.runner -> ponder.train.rl",
        "ponder.rewards.qa -> ponder.envs.synthetic",
        "ponder.rollout.engine -> ponder.envs.search_qa",
        "ponder.serve.app -> ponder.cli.serve",
        "ponder.train.rl -> ponder.jobs.demo",
        "ponder.train.rl -> ponder.wiring",
    ]
    # the protocol, the package's own modules and the named exceptions are allowed
    assert violations({"ponder.rollout.engine": {"ponder.envs.base"}, "ponder.cli.core": {"ponder.cli.agent"},
                       "ponder.train.ray.rollouts": {"ponder.wiring"}}) == []  # fmt: skip


def test_imports_are_read_from_every_form():
    source = "import os\nfrom ponder.envs.search_qa import X\nfrom . import sibling\nfrom ponder import wiring\n"
    source += "def f():\n    from ..models import lora\n"
    assert imports_of(source, "ponder.train.rl") == {
        "os", "ponder.envs.search_qa", "ponder.train", "ponder", "ponder.wiring", "ponder.models",
    }  # fmt: skip
