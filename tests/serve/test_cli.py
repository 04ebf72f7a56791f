"""`ponder serve` as a real subprocess: it starts, answers the openai client, stops on
SIGTERM; bad flags are one line and exit code 2 before anything listens."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest


def ponder(*args, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "ponder.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)  # fmt: skip


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_runs_as_a_command_with_an_adapter_and_a_key_from_the_environment(adapter_paths):
    port = free_port()
    os.environ["PONDER_API_KEY"] = "env-key"
    try:
        server = ponder("serve", "--model", "tiny", "--port", str(port), "--adapter", f"beta={adapter_paths['beta']}",
                        "--log-level", "warning")  # fmt: skip
    finally:
        del os.environ["PONDER_API_KEY"]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="env-key", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny", "beta"]
        reply = client.chat.completions.create(model="beta", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, temperature=0)  # fmt: skip
        assert reply.usage.completion_tokens == 4
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
    assert f"serving tiny, beta on http://127.0.0.1:{port}/v1 (backend hf); API key required" in stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--adapter", "nopath"], "--adapter 'nopath': write NAME=PATH"),
        (["--adapter", "a=/no/such/dir"], "--adapter a=/no/such/dir: no such directory"),
        (["--adapter", "a=/tmp", "--adapter", "a=/tmp"], "--adapter 'a' given twice"),
        (["--adapter", "tiny=/tmp"], "--adapter 'tiny': that name is the base model's"),
        (["--max-tokens-limit", "0"], "max_tokens_limit must be >= 1, got 0"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(flags, message):
    result = ponder("serve", "--model", "tiny", "--port", str(free_port()), *flags)
    _, stderr = result.communicate(timeout=120)
    assert result.returncode == 2
    assert stderr.strip().splitlines() == [f"ponder serve: error: {message}"]


def test_a_directory_without_an_adapter_is_refused(tmp_path):
    result = ponder("serve", "--model", "tiny", "--adapter", f"x={tmp_path}")
    _, stderr = result.communicate(timeout=120)
    assert result.returncode == 2
    assert stderr.strip() == (f"ponder serve: error: --adapter x={tmp_path}: neither a PEFT adapter "
                              "(adapter_config.json + adapter_model.safetensors) nor a ponder run, stage or "
                              "checkpoint directory")  # fmt: skip
