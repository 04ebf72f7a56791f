"""Run the app under uvicorn: `build_server` (not yet running, for tests and embedding)
and `serve` (until interrupted)."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn

from ponder.serve.app import create_app
from ponder.serve.engine import ModelServer, ServeConfig


def build_server(model_server: ModelServer, log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for `model_server` on its config's host and port, not yet running:
    call .run() (or run it in a thread, optionally on a socket you bound yourself) and set
    .should_exit to stop it."""
    config = model_server.config
    app = create_app(model_server)
    return uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level))


def serve(config: ServeConfig, log_level: str = "info", say: Callable[[str], None] = print) -> None:
    """Load the model and serve it until interrupted (loopback unless config.host says
    otherwise); `say` gets one line naming the models and the URL once they are loaded."""
    model_server = ModelServer.load(config)
    names = ", ".join([config.model, *config.adapters])
    keyed = "; API key required" if config.api_key else ""
    keyed += f"; per-user adapters in {config.users}" if config.users else ""
    say(f"serving {names} on http://{config.host}:{config.port}/v1 (backend {model_server.backend}){keyed}")
    try:
        build_server(model_server, log_level).run()
    finally:
        model_server.close()
