"""ponder: train LLM agents that think, search and call tools, and run them.

The Python API is `from ponder.api import load_recipe, train, evaluate, serve`
(`ponder.train` and `ponder.serve` are the trainers' and the server's packages)."""

__version__ = "0.1.0"
