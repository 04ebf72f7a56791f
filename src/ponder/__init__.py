"""ponder: train LLM agents that think, search and call tools, and run them.

`from ponder import load_recipe, train, evaluate, serve` is the Python API
(ponder.api); they load on first use, so `import ponder` stays light."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["evaluate", "load_recipe", "serve", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ponder import api

        return getattr(api, name)
    raise AttributeError(f"module 'ponder' has no attribute {name!r}")
