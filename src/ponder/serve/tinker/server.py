"""Run the Tinker-compatible app under uvicorn: `build_tinker_server` (not yet running,
for tests and embedding) and `serve_tinker` (until interrupted)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ponder.extras import require
from ponder.serve.tinker.service import TinkerConfig, TinkerService


def build_tinker_server(service: TinkerService, log_level: str = "info") -> Any:
    """A uvicorn server for `service` on its config's host and port, not yet running:
    call .run() (or run it in a thread, on a socket you bound yourself) and set
    .should_exit to stop it."""
    uvicorn = require("uvicorn", "tinker", "ponder tinker-serve")
    from ponder.serve.tinker.routes import create_tinker_app

    config = service.config
    app = create_tinker_app(service)
    return uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level))


def serve_tinker(config: TinkerConfig, log_level: str = "info", say: Callable[[str], None] = print) -> None:
    """Load the base model and serve it until interrupted; `say` gets one line with the
    URL to give the client (base_url) once the model is loaded."""
    require("tinker", "tinker", "ponder tinker-serve")
    service = TinkerService.load(config)
    keyed = "; API key required (X-API-Key)" if config.api_key else "; any TINKER_API_KEY starting tml- is accepted"
    say(f"serving {config.model} for the tinker client on http://{config.host}:{config.port} "
        f"(ServiceClient(base_url=...)), checkpoints in {service.state_dir}{keyed}")  # fmt: skip
    try:
        build_tinker_server(service, log_level).run()
    finally:
        service.close()
