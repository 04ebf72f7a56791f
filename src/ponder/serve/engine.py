"""The served model: its settings, its names, prompt encoding and generation.

`ModelServer.load(config)` picks the backend (`resolve_backend`), then either loads
the base policy with its adapters behind ponder's batching worker (`hf`, serve/
batcher.py) or starts / reaches a vLLM server with the adapters loaded into it
(`vllm`, serve/vllm.py). Both take `Job`s through one small interface (`Generator`),
so the HTTP layer (serve/app.py) only turns requests into `Job`s and results into
OpenAI's shapes, the same for either backend.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ponder.models.base_hash import base_model_hash
from ponder.models.chat import encode_chat
from ponder.models.loading import EMBEDDED_NAME, load_policy
from ponder.personal.config import PersonalConfig
from ponder.rollout.constrain import Constraint, ConstraintError, grammars_for
from ponder.serve.adapters import AdapterBackend, attach_adapters, find_adapter
from ponder.serve.batcher import Batcher, Job, JobResult
from ponder.serve.errors import APIError, bad_request

API_KEY_ENV = "PONDER_API_KEY"


@dataclass
class ServeConfig:
    """How `ponder serve` runs.

    model: the base model (smollm2-135m, tiny, a HF model dir, a ponder run dir).
    adapters: served model name -> adapter path (PEFT dir, or a run / checkpoint dir).
    host, port: where to listen; loopback unless told otherwise.
    api_key: required as `Authorization: Bearer KEY` when set (None: open).
    max_tokens_limit: the most tokens one completion may ask for (400 above it).
    max_body_bytes: the largest request body (413 above it).
    max_choices: the largest `n` (choices per request) and prompts per completion.
    batch_window_ms: how long the worker waits for more requests to join a batch.
    max_batch_size: the most requests generated in one batch.
    cached_samplers: merged adapter copies kept for sampling (LRU; ~0.4 GB each for
        the embedded model).
    device, dtype, seed: where and how the model runs; the sampling seed.
    backend: `hf` (ponder's own: transformers / the lean CPU decoder, batched by serve/
        batcher.py), `vllm` (a vLLM server doing continuous batching, serve/vllm.py), or
        `auto`: vllm when vllm_url is set, or when vllm_python exists and vLLM can load
        the model (not `tiny`, not a ponder run dir with merged adapters); else hf.
    vllm_url: a running vLLM server to generate on (unset: start one with vllm_python).
    vllm_python: the python of vLLM's own venv (`make vllm-venv`).
    vllm_start_timeout_s: how long a vLLM server started here may take to come up.
    vllm_timeout_s: the longest wait for a vLLM server's next token (then 503).
    users: a per-user adapter store (personal/store.py; created when missing): chats with
        OpenAI's `user` field on the base model are answered with that user's adapter,
        logged, and learn from feedback (serve/users.py). hf backend only.
    personal: the settings of an update of a user's adapter (a request may override them).
    """

    model: str = EMBEDDED_NAME
    adapters: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_tokens_limit: int = 1024
    max_body_bytes: int = 1_000_000
    max_choices: int = 8
    batch_window_ms: float = 5.0
    max_batch_size: int = 32
    cached_samplers: int = 3
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    backend: str = "auto"
    vllm_url: str | None = None
    vllm_python: str = ".venv-vllm/bin/python"
    vllm_start_timeout_s: float = 600.0
    vllm_timeout_s: float = 300.0
    users: str | None = None
    personal: PersonalConfig = field(default_factory=PersonalConfig)

    def __post_init__(self) -> None:
        for name in ("max_tokens_limit", "max_body_bytes", "max_choices", "max_batch_size", "cached_samplers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_window_ms < 0:
            raise ValueError("batch_window_ms must be >= 0")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it unset to serve without one)")
        if self.model in self.adapters:
            raise ValueError(f"--adapter {self.model!r}: that name is the base model's")
        if self.backend not in ("auto", "hf", "vllm"):
            raise ValueError(f"--backend {self.backend!r}: choose auto, hf or vllm")
        if self.vllm_url and self.backend == "hf":
            raise ValueError("--vllm-url is for --backend vllm (or auto), not hf")
        if self.vllm_start_timeout_s <= 0 or self.vllm_timeout_s <= 0:
            raise ValueError("vllm_start_timeout_s and vllm_timeout_s must be > 0")
        if self.users is not None and (self.backend == "vllm" or self.vllm_url):
            raise ValueError("--users needs --backend hf: per-user adapters are trained in this process and "
                             "swapped into its own model, which a vLLM server does not share")  # fmt: skip


def api_key_from_env() -> str | None:
    return os.environ.get(API_KEY_ENV) or None


def resolve_backend(config: ServeConfig) -> str:
    """`hf` or `vllm` for config.backend (see ServeConfig for what `auto` picks)."""
    from ponder.rollout.vllm import model_dir_of

    if config.backend != "auto":
        return config.backend
    if config.users is not None:
        return "hf"
    if config.vllm_url:
        return "vllm"
    if not Path(config.vllm_python).is_file():
        return "hf"
    try:
        model_dir_of(config.model)
    except ValueError:
        return "hf"
    return "vllm"


class Generator(Protocol):
    """What generates a server's jobs: serve/batcher.py's Batcher (hf) or serve/vllm.py's
    VLLMGenerator. `submit` returns the job's future (a JobResult); `health` is None
    while it can generate, else why not; `cancelled` counts jobs whose client left."""

    cancelled: int

    def submit(self, job: Job) -> Future: ...

    def stop(self) -> None: ...

    def health(self) -> str | None: ...


class ModelServer:
    """The base model with its adapters behind one Generator (see module docstring)."""

    def __init__(self, config: ServeConfig, generator: Generator, tokenizer: Any, context_limit: int,
                 backend: str, users: Any = None) -> None:  # fmt: skip
        self.config = config
        self.users = users  # serve/users.py's UserAdapters with --users, else None
        self.created = int(time.time())
        self.base_name = config.model
        self.adapter_names = list(config.adapters)
        self.generator = generator
        self.backend = backend
        # The generator decodes with its own tokenizer on its own thread; requests are
        # encoded on the event loop with a copy (a fast tokenizer used from two threads
        # at once can fail with "Already borrowed").
        self.tokenizer = copy.deepcopy(tokenizer)
        self.context_limit = context_limit
        # what a constraint is checked against here (the generator compiles its own copy)
        self.eos_ids = {tokenizer.eos_token_id}
        self.vocab_size = len(tokenizer)

    @classmethod
    def load(cls, config: ServeConfig) -> ModelServer:
        """Check every adapter path, then load the model or reach vLLM (ValueError on bad input)."""
        found = {name: find_adapter(name, path, config.model) for name, path in config.adapters.items()}
        if resolve_backend(config) == "vllm":
            from ponder.serve.vllm import VLLMGenerator

            vllm = VLLMGenerator.connect(config, found)
            return cls(config, vllm, vllm.tokenizer, vllm.context_limit, "vllm")
        policy = load_policy(config.model, config.dtype, config.device)
        base_hash = base_model_hash(policy.model) if config.users is not None else ""  # before any adapter is attached
        policy = attach_adapters(policy, found)
        backend = AdapterBackend(policy, seed=config.seed, cached_samplers=config.cached_samplers)
        batcher = Batcher(backend, config.batch_window_ms / 1000, config.max_batch_size)
        batcher.start()
        users = None
        if config.users is not None:
            from ponder.personal.store import AdapterStore
            from ponder.serve.users import UserAdapters

            users = UserAdapters(AdapterStore(config.users), backend, batcher.lock,
                                 lambda: load_policy(config.model, config.dtype, config.device), config.personal,
                                 base_hash)  # fmt: skip
        context_limit = int(getattr(policy.model.config, "max_position_embeddings", 0) or 1 << 30)
        server = cls(config, batcher, policy.tokenizer, context_limit, "hf", users)
        server.eos_ids, server.vocab_size = backend.eos_ids, policy.model.config.vocab_size
        return server

    def close(self) -> None:
        if self.users is not None:
            self.users.stop()
        self.generator.stop()

    def health(self) -> str | None:
        return self.generator.health()

    def models(self) -> list[dict[str, Any]]:
        """OpenAI's model objects: the base, then each adapter (its `parent` the base)."""
        base = {"id": self.base_name, "object": "model", "created": self.created, "owned_by": "ponder",
                "root": self.base_name, "parent": None}  # fmt: skip
        adapters = [{**base, "id": name, "parent": self.base_name} for name in self.adapter_names]
        return [base, *adapters]

    def adapter_for(self, model: str) -> str | None:
        """The adapter a request's `model` names (None: the base); 404 for an unknown name."""
        if model == self.base_name:
            return None
        if model in self.adapter_names:
            return model
        served = ", ".join([self.base_name, *self.adapter_names])
        raise APIError(404, f"the model {model!r} does not exist; this server has: {served}", "model_not_found",
                       param="model")  # fmt: skip

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def check_constraint(self, constraint: Constraint | None) -> None:
        """Compile `constraint` now (cached), so one that cannot be met is a 400 naming
        why before anything is queued."""
        if constraint is None:
            return
        try:
            grammars_for(self.tokenizer, self.eos_ids, self.vocab_size).matcher(constraint)
        except ConstraintError as err:
            param = "tools" if constraint.kind == "lark" else "response_format"
            raise bad_request(f"{param}: {err}", param=param, code="invalid_schema") from None

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def token_budget(self, prompt_ids: list[int], asked: int | None) -> int:
        """max_tokens for a prompt: as asked, or whatever fits (at most --max-tokens-limit)."""
        limit = self.config.max_tokens_limit
        if asked is not None and asked > limit:
            raise bad_request(f"max_tokens {asked} is more than this server's limit of {limit} "
                              "(--max-tokens-limit)", param="max_tokens", code="max_tokens_too_large")  # fmt: skip
        room = self.context_limit - len(prompt_ids)
        if room < 1 or (asked is not None and asked > room):
            raise bad_request(f"the prompt is {len(prompt_ids)} tokens and max_tokens {asked or 1}; the model "
                              f"reads at most {self.context_limit}", param="messages",
                              code="context_length_exceeded")  # fmt: skip
        return asked if asked is not None else min(limit, room)

    async def generate(self, job: Job) -> JobResult:
        """Queue `job` and wait for its result without blocking the event loop."""
        return await asyncio.wrap_future(self.generator.submit(job))
