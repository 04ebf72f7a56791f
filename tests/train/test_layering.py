"""The trainers take their parts: no module under ponder/train imports a particular
environment (only ponder.wiring turns a recipe into one)."""

from __future__ import annotations

import ast
from pathlib import Path

import ponder.train

TRAIN_DIR = Path(ponder.train.__file__).parent
# Modules that build a world: only ponder.wiring and the environments may import them.
WORLD_MODULES = ("ponder.envs.search_qa", "ponder.envs.data", "ponder.envs.math", "ponder.envs.code",
                 "ponder.envs.function_calling", "ponder.envs.synthetic")  # fmt: skip


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_trainer_module_imports_an_environment():
    offending = {
        path.name: sorted(name for name in _imports(path) if name.startswith(WORLD_MODULES))
        for path in sorted(TRAIN_DIR.glob("*.py"))
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_imports_are_read_from_import_and_from_lines(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\nfrom ponder.envs.search_qa import SearchQAEnv\nfrom . import x\n")
    assert _imports(source) == {"os", "ponder.envs.search_qa"}
