"""`ponder serve`: an OpenAI-compatible HTTP server for trained policies and their adapters."""

from ponder.serve.app import create_app
from ponder.serve.engine import API_KEY_ENV, ModelServer, ServeConfig, api_key_from_env
from ponder.serve.server import build_server, serve

__all__ = ["API_KEY_ENV", "ModelServer", "ServeConfig", "api_key_from_env", "build_server", "create_app", "serve"]
