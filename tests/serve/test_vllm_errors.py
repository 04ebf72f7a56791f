"""`ponder serve --backend vllm` when no vLLM can be had, as a real subprocess: a
--vllm-url nobody answers, a vLLM python that exits or never comes up, a model vLLM
cannot load: each one line and exit code 2 within bounded time. And what `--backend
auto` picks. No vLLM runs here (the slow module test_vllm_slow.py runs one)."""

import time

import pytest

from ponder.models import tiny_policy
from ponder.serve import ServeConfig
from ponder.serve.engine import resolve_backend

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
