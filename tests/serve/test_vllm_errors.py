"""`ponder serve --backend vllm` when no vLLM can be had, as a real subprocess: a
--vllm-url nobody answers, a vLLM python that exits or never comes up, a model vLLM
cannot load: each one line and exit code 2 within bounded time. A vLLM server that
stalls mid-request (an HTTP server on 127.0.0.1 that answers /health and /v1/models
but never a completion): a one-line 503 within the timeout, the server still serving.
And what `--backend auto` picks. No vLLM runs here (test_vllm_slow.py runs one)."""

import http.server
import json
import threading
import time

import httpx

import pytest

from ponder.models import tiny_policy
from ponder.serve import ServeConfig
from ponder.serve.engine import resolve_backend

from .conftest import running_server
from .test_cli import free_port, ponder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model as a Hugging Face model directory (what vLLM would load)."""
    directory = tmp_path_factory.mktemp("tiny-model")
    policy = tiny_policy()
    policy.model.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)
    return directory


def fake_python(tmp_path, body: str):
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def serve_error(*flags) -> tuple[int, list[str], float]:
    start = time.monotonic()
    result = ponder("serve", "--backend", "vllm", "--port", str(free_port()), *flags)
    _, stderr = result.communicate(timeout=120)
    return result.returncode, stderr.strip().splitlines(), time.monotonic() - start


def test_a_vllm_url_nobody_answers_is_one_line_and_exit_2(model_dir):
    port = free_port()  # closed: bound and released
    code, lines, seconds = serve_error("--model", str(model_dir), "--vllm-url", f"http://127.0.0.1:{port}")
    assert code == 2 and seconds < 60
    assert lines == [f"ponder serve: error: --vllm-url http://127.0.0.1:{port}: no vLLM server answers there "
                     "(GET /health failed within 5 s)"]  # fmt: skip


def test_a_vllm_server_that_never_comes_up_fails_in_bounded_time(model_dir, tmp_path):
    python = fake_python(tmp_path, "sleep 300")
    code, lines, seconds = serve_error("--model", str(model_dir), "--vllm-python", str(python),
                                       "--vllm-start-timeout", "3")  # fmt: skip
    assert code == 2 and seconds < 60
    assert len(lines) == 1 and lines[0].startswith("ponder serve: error: vLLM server not up after 3 s (log: ")


def test_a_vllm_server_that_exits_while_starting_is_one_line(model_dir, tmp_path):
    python = fake_python(tmp_path, "echo 'ImportError: no module named vllm' >&2; exit 3")
    code, lines, _ = serve_error("--model", str(model_dir), "--vllm-python", str(python))
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("ponder serve: error: vLLM server exited with code 3 while "
                                                   "starting: ImportError: no module named vllm (log: ")  # fmt: skip


def test_models_and_flags_vllm_cannot_take_are_refused(tmp_path):
    code, lines, _ = serve_error("--model", "tiny", "--vllm-url", "http://127.0.0.1:9")
    assert code == 2
    assert lines == ["ponder serve: error: --backend vllm: model 'tiny' is not a model directory vLLM can load "
                     "(a ponder run dir: `ponder export --merge` it; or use --backend hf)"]  # fmt: skip
    code, lines, _ = serve_error("--model", "tiny", "--vllm-python", str(tmp_path / "none"), "--backend", "hf",
                                 "--vllm-url", "http://127.0.0.1:9")  # fmt: skip
    assert (code, lines) == (2, ["ponder serve: error: --vllm-url is for --backend vllm (or auto), not hf"])


def test_auto_picks_vllm_only_when_it_is_there_and_can_load_the_model(model_dir, tmp_path):
    python = fake_python(tmp_path, "exit 0")
    missing = str(tmp_path / "no-venv" / "python")
    assert resolve_backend(ServeConfig(model=str(model_dir), vllm_python=str(python))) == "vllm"
    assert resolve_backend(ServeConfig(model=str(model_dir), vllm_python=missing)) == "hf"
    assert resolve_backend(ServeConfig(model="tiny", vllm_python=str(python))) == "hf"  # vLLM cannot load it
    assert resolve_backend(ServeConfig(model="tiny", vllm_url="http://127.0.0.1:9")) == "vllm"
    assert resolve_backend(ServeConfig(model=str(model_dir), vllm_python=str(python), backend="hf")) == "hf"


class _StalledVLLM(http.server.BaseHTTPRequestHandler):
    """Where a vLLM server would be: /health and /v1/models answer, a completion never starts."""

    def do_GET(self):  # noqa: N802 - http.server's name
        models = {"object": "list", "data": [{"id": "base", "parent": None, "max_model_len": 256}]}
        body = json.dumps(models).encode() if self.path == "/v1/models" else b""
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        time.sleep(10)

    def log_message(self, *args):
        pass


def test_a_stalled_vllm_server_costs_a_request_a_503_and_the_server_goes_on(model_dir):
    stalled = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StalledVLLM)
    threading.Thread(target=stalled.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{stalled.server_address[1]}"
    try:
        with running_server(ServeConfig(model=str(model_dir), vllm_url=url, vllm_timeout_s=1.0)) as served:
            assert served.model_server.backend == "vllm" and served.model_server.context_limit == 256
            start = time.monotonic()
            answer = httpx.post(f"{served.url}/chat/completions", timeout=30,
                                json={"model": str(model_dir), "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
            assert time.monotonic() - start < 5
            assert answer.status_code == 503
            assert answer.json()["error"] == {"message": f"the vLLM server {url} sent nothing for 1 s",
                                              "type": "server_error", "param": None, "code": "backend_unavailable"}  # fmt: skip
            assert httpx.get(f"{served.url}/models", timeout=10).status_code == 200
    finally:
        stalled.shutdown()
