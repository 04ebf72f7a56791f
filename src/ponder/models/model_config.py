"""A model's config (config.json's fields, as a dict) without loading its weights,
for every name `load_policy` takes: the embedded model (its cached copy's
config.json, else the GGUF file's metadata), `tiny`, a Hugging Face model
directory, a ponder run, stage or checkpoint directory (its base model's config, or
its own for a full fine-tune), or a hub id (config.json alone; needs the network
unless it is in the local cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ponder.models.loading import EMBEDDED_NAME, ModelLoadError, cache_dir, embedded_gguf_path


def read_model_config(name_or_path: str) -> dict[str, Any]:
    """config.json's fields for `name_or_path`; ModelLoadError when there is none."""
    if name_or_path == "tiny":
        from ponder.models.tiny import tiny_config, tiny_tokenizer

        return tiny_config(tiny_tokenizer()).to_dict()
    if name_or_path == EMBEDDED_NAME:
        return _embedded_config()
    path = Path(name_or_path).expanduser()
    if path.exists():
        if (path / "config.json").is_file():
            return _read_json(path / "config.json")
        from ponder.models.adapters import read_manifest, require_trained

        trained = require_trained(path)
        manifest = read_manifest(trained)
        return _read_json(trained / "config.json") if manifest["kind"] == "full" else read_model_config(
            manifest["base_model"]
        )
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
        raise ModelLoadError(f"model '{name_or_path}' not found: give '{EMBEDDED_NAME}', 'tiny', a local model "
                             "directory or a hub id like 'org/name'")  # fmt: skip
    return _hub_config(name_or_path)


def _embedded_config() -> dict[str, Any]:
    cached = cache_dir() / "models" / EMBEDDED_NAME / "config.json"
    if cached.is_file():
        return _read_json(cached)
    from transformers import AutoConfig

    gguf = embedded_gguf_path()  # the header's metadata only: no tensor is dequantised
    return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).to_dict()


def _hub_config(name: str) -> dict[str, Any]:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name).to_dict()
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot read the config of model '{name}': {str(err).splitlines()[0]}") from err


def _read_json(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{path}: unreadable model config ({err})") from err
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: a model config must be a JSON object")
    return config.get("text_config", config) if "vocab_size" not in config else config
