"""`ponder serve`: an OpenAI-compatible HTTP server for trained policies and their adapters."""

from ponder.extras import require

# Every module of the server needs FastAPI and uvicorn: one line naming the extra, not
# a traceback, when `ponder serve` (or ponder.serve) is used without it.
require("fastapi", "serve", "ponder serve")
require("uvicorn", "serve", "ponder serve")

from ponder.serve.app import create_app  # noqa: E402
from ponder.serve.engine import API_KEY_ENV, ModelServer, ServeConfig, api_key_from_env  # noqa: E402
from ponder.serve.server import build_server, serve  # noqa: E402

__all__ = ["API_KEY_ENV", "ModelServer", "ServeConfig", "api_key_from_env", "build_server", "create_app", "serve"]
