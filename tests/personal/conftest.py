"""Shared pieces of the per-user adapter tests: PEFT adapter directories on the tiny
model (random non-zero LoRA B matrices, so each changes the model's output) and the
tiny base's hash."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from ponder.models import tiny_policy
from ponder.models.base_hash import base_model_hash

from ..tiny_lora import random_lora
from ..uvicorn_thread import loopback_socket, serving


def lora_state(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "adapter_model.safetensors")


@pytest.fixture(scope="session")
def adapter_dirs(tmp_path_factory) -> dict[str, Path]:
    """Two PEFT adapter directories (`one`, `two`) for the tiny model."""
    root = tmp_path_factory.mktemp("peft")
    dirs = {}
    for name, seed in (("one", 1), ("two", 2)):
        random_lora(seed).model.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


@pytest.fixture(scope="session")
def tiny_hash() -> str:
    return base_model_hash(tiny_policy().model)


@contextlib.contextmanager
def running_server(config):
    """`config` served by uvicorn from a background thread on a free loopback port; yields
    (API root URL, the ModelServer)."""
    from ponder.serve import ModelServer, build_server

    model_server = ModelServer.load(config)
    try:
        with serving(build_server(model_server, log_level="warning"), loopback_socket(), must_stop=False) as port:
            yield f"http://127.0.0.1:{port}/v1", model_server
    finally:
        model_server.close()
