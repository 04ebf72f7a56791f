"""A vLLM OpenAI-compatible server, started by ponder in its own venv or reached by URL.

vLLM pins its own torch and transformers, so it lives in `.venv-vllm` (`make
vllm-venv`) and ponder only talks to it over HTTP. Every failure is bounded in time:
a server that is not there is reported in seconds, each request has a timeout and a
few retries with backoff, and a server that dies mid-step ends the run with one line
(`BackendError`) rather than a hang.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.httpretry import one_line, post_retrying

BASE_NAME = "ponder-base"  # the name the base model is served under
# vLLM's accepted --max-lora-rank values; an adapter's rank is rounded up to one of them.
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class BackendError(ConnectionError):
    """The generation server failed (down, timing out, or died); one-line message.
    A ConnectionError, so the CLI reports it as one line, not as a ponder bug."""


@dataclass
class ServerSpec:
    """What a started server serves: the base model directory, its dtype, the LoRA
    rank it must accept (0 = no adapters), the longest context, the sampling seed,
    and whether it takes in-place weight reloads (vLLM's development endpoints)."""

    model_dir: str
    dtype: str = "float32"
    max_lora_rank: int = 0
    max_model_len: int = 2048
    seed: int = 0
    weight_reload: bool = False
    extra_args: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def lora_rank_for(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in _LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"rollout.backend vllm: LoRA rank {rank} is above vLLM's largest ({_LORA_RANKS[-1]})")


class VLLMServer:
    """HTTP access to one vLLM server; `start` launches one, the constructor reaches
    a running one. `timeout_s` bounds each request, `retries` extra attempts follow a
    timeout, a connection error or a 5xx answer (backoff 0.5 s, 1 s, 2 s …)."""

    # url -> the tag of the weights an in-place reload last put there, shared by every
    # client of that URL in this process (absent: the model on disk)
    _weights: dict[str, str] = {}
    # url -> held by a backend while it makes the server hold its weights and samples
    # from them, so another's reload cannot land in the middle (asynchronous rollouts)
    _locks: dict[str, threading.Lock] = {}

    @property
    def weights_tag(self) -> str:
        return self._weights.get(self.url, "")

    @property
    def lock(self) -> threading.Lock:
        return self._locks.setdefault(self.url, threading.Lock())

    def __init__(self, url: str, timeout_s: float = 120.0, retries: int = 2, check_s: float = 5.0) -> None:
        import httpx

        if retries < 0:
            raise ValueError(f"rollout.vllm_retries must be >= 0, got {retries}")
        self.url = url.rstrip("/")
        self.timeout_s, self.retries = timeout_s, retries
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.failed = False  # a failure's message names the log: keep it then
        self._client = httpx.Client(timeout=timeout_s)
        if check_s > 0 and not self.healthy(check_s):
            self._client.close()
            raise BackendError(f"rollout.vllm_url {self.url}: no vLLM server answers there (GET /health failed "
                               f"within {check_s:g} s); start one or leave rollout.vllm_url unset")  # fmt: skip

    @classmethod
    def start(cls, spec: ServerSpec, python: str, start_timeout_s: float = 600.0, timeout_s: float = 120.0,
              retries: int = 2) -> VLLMServer:  # fmt: skip
        """Launch `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 and a free
        port, wait for /health; a server that exits or is not up in start_timeout_s is a
        BackendError quoting its log's last line."""
        if not Path(python).is_file():
            raise BackendError(f"rollout.vllm_python {python}: not found; run `make vllm-venv` to install vLLM")
        port = free_port()
        log_path = Path(tempfile.mkdtemp(prefix="ponder-vllm-")) / "server.log"
        env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
        if spec.weight_reload:  # /collective_rpc and /reset_prefix_cache, on 127.0.0.1 only
            env["VLLM_SERVER_DEV_MODE"] = "1"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM-CPU's default takes far more than a 135M model needs
        with open(log_path, "wb") as log:
            # A session of its own: vLLM forks an engine process, and killing the group ends both.
            process = subprocess.Popen(_command(spec, python, port), stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True, preexec_fn=_die_with_parent)  # fmt: skip
        server = cls(f"http://127.0.0.1:{port}", timeout_s, retries, check_s=0)
        server.process, server.log_path = process, log_path
        atexit.register(server.close)
        deadline = time.monotonic() + start_timeout_s
        while not server.healthy(2.0):
            if process.poll() is not None:
                server.failed = True
                server.close()
                raise BackendError(f"vLLM server exited with code {process.returncode} while starting: "
                                   f"{_last_line(log_path)} (log: {log_path})")  # fmt: skip
            if time.monotonic() > deadline:
                server.failed = True
                server.close()
                raise BackendError(f"vLLM server not up after {start_timeout_s:g} s (log: {log_path})")
            time.sleep(1.0)
        return server

    def base_model(self) -> str:
        """The name the server serves its base model under (its first model without
        a parent; adapters list the base as their parent)."""
        if self.process is not None:
            return BASE_NAME
        models = self.get("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        names = [m.get("id") for m in data or [] if isinstance(m, dict) and not m.get("parent")]
        if not names:
            raise BackendError(f"vLLM server {self.url} lists no base model at /v1/models")
        return str(names[0])

    def model_names(self) -> list[str]:
        """Every model the server serves: the base and the adapters loaded into it."""
        models = self.get("/v1/models")
        return [str(m.get("id")) for m in (models.get("data") or []) if isinstance(m, dict)]

    def get(self, path: str) -> Any:
        import httpx

        try:
            response = self._client.get(f"{self.url}{path}")
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise self._fail(f"failed GET {path} ({type(exc).__name__}: {one_line(exc)})", 1) from None

    def healthy(self, timeout_s: float) -> bool:
        import httpx

        try:
            return self._client.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def post(self, path: str, payload: dict[str, Any]) -> Any:
        """POST JSON and return the decoded answer, retrying transient failures; a
        BackendError once the attempts are spent or on a 4xx answer."""

        def alive() -> None:
            if (died := self.exit_reason()) is not None:
                raise self._fail(died, 0)

        response = post_retrying(self._client, f"{self.url}{path}", payload, self.retries, 0.5, self._fail,
                                 timed_out=f"timed out after {self.timeout_s:g} s", rejected=f"rejected {path}",
                                 before=alive)  # fmt: skip
        try:
            return response.json()
        except ValueError:  # /v1/load_lora_adapter answers plain text, the OpenAI routes JSON
            return response.text

    def exit_reason(self) -> str | None:
        """Why a server started here is gone (its exit code and log's last line); None
        while it runs, and always for a server reached by URL."""
        if self.process is None or self.process.poll() is None:
            return None
        return f"exited with code {self.process.returncode} ({_last_line(self.log_path)})"

    def load_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter at `path` under `name` (vLLM's runtime LoRA loading)."""
        try:
            self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        except BackendError:
            # a retried load whose first attempt went through after its timeout is refused
            # as a duplicate: the adapter is there all the same
            if name not in self.model_names():
                raise

    def reload_weights(self, path: str, tag: str) -> None:
        """Reload the served model's weights in place from the checkpoint directory
        `path` (vLLM's development endpoint /collective_rpc) and drop the prefix cache,
        whose keys and values the old weights computed; `tag` names them after."""
        self._weights.pop(self.url, None)
        try:
            self.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
            self.post("/reset_prefix_cache", {})
        except BackendError as err:
            if self.process is None and "HTTP 404" in str(err):
                raise BackendError(f"{err}; start the server with VLLM_SERVER_DEV_MODE=1 for in-place weight "
                                   "reloads, or use rollout.vllm_weight_sync: adapter") from None  # fmt: skip
            raise
        self._weights[self.url] = tag

    def _fail(self, reason: str, attempts: int) -> BackendError:
        """attempts 0: the server is gone, no request was tried."""
        self.failed = True
        plural = "attempt" if attempts == 1 else "attempts"
        tried = f" after {attempts} {plural}" if attempts else ""
        where = f" (log: {self.log_path})" if self.log_path else ""
        return BackendError(f"vLLM server {self.url} {reason}{tried}{where}")

    def close(self) -> None:
        """Stop a server started here (its whole process group); leave a reached one alone."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=15)
        if process is not None and self.log_path is not None and not self.failed:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)
        self._client.close()


def _command(spec: ServerSpec, python: str, port: int) -> list[str]:
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_dir,
        "--served-model-name", BASE_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", spec.dtype, "--seed", str(spec.seed), "--max-model-len", str(spec.max_model_len),
        # Log-probs after temperature and top-p, i.e. of the distribution tokens were drawn from.
        "--logprobs-mode", "processed_logprobs", "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if spec.max_lora_rank:
        command += ["--enable-lora", "--max-lora-rank", str(spec.max_lora_rank), "--max-loras", "2"]
    return command + list(spec.extra_args)


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM it when ponder dies, even by a
    signal that skips atexit (Linux's PR_SET_PDEATHSIG; vLLM's engine process follows
    its API server down). Elsewhere a no-op: close() and atexit stop it."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(path: Path | None) -> str:
    """The log's last non-empty line (vLLM's own reason for exiting, usually)."""
    if path is None or not path.is_file():
        return "no log"
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return one_line(lines[-1]) if lines else "empty log"
