"""The README's own commands run as written (on the tiny model) and do what it says.

Every `ponder …` line of the README's bash blocks must be listed in COMMANDS, and each
one is run (with tiny-model settings appended, which override the recipe); `ponder
serve`, which serves until stopped, runs as a process on a free port and answers one
request. A README command missing here fails the test, so the README cannot drift from
what ponder accepts.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ponder.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL_WORLD = ["env.options.taskgen.n_people=20", "env.options.taskgen.n_train=8", "env.options.taskgen.n_eval=2"]
TINY = [
    "model.name=tiny", "sft.steps=2", "sft.batch_size=2", "sft.examples=4", "train.steps=2",
    "train.tasks_per_step=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens_per_turn=8",
    "train.save_every=1", "lora.r=4", "eval.episodes=2", *SMALL_WORLD,
]  # fmt: skip
# README command → what the test appends to it (tiny-model settings, which override the recipe).
COMMANDS: dict[str, list[str]] = {
    "ponder --help": [],
    "ponder demo --quick": TINY,
    "ponder train --recipe recipes/search_qa_grpo.yaml --out runs/grpo": TINY,
    "ponder train --resume runs/grpo train.steps=30": ["train.steps=3"],
    "ponder eval --recipe recipes/search_qa.yaml --model runs/grpo --episodes 32 --out runs/eval": SMALL_WORLD,
    "ponder report runs/grpo": [],
    "ponder chat --model runs/grpo --tools calculator": [],
    "ponder serve --adapter grpo=runs/grpo --port 8000": ["--model", "tiny"],  # the run's base
    "ponder export runs/grpo --out runs/grpo-hf --merge": [],
}


def readme_commands() -> list[str]:
    """`ponder …` commands of the README's bash blocks, comments dropped, `&&` split."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            commands += [part.strip() for part in line.split("&&") if part.strip().startswith("ponder")]
    return commands


def test_every_readme_command_is_listed():
    assert [c for c in readme_commands() if c not in COMMANDS] == []


def _serve(argv: list[str], cwd: Path) -> str:
    """Start `ponder serve` on a free port (for the README's 8000), ask the first adapter
    it serves one question, stop it; returns the reply's JSON."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [str(port) if before == "--port" else word for before, word in zip(["", *argv], argv)]
    adapter = argv[argv.index("--adapter") + 1].split("=")[0]
    server = subprocess.Popen([sys.executable, "-m", "ponder.cli", *argv], cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        assert server.poll() is None, f"ponder serve exited: {server.stdout.read()[-800:]}"
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": adapter, "max_tokens": 4, "messages": [{"role": "user", "content": "What is 2 + 2?"}]})
        assert reply.status_code == 200, reply.text
        return reply.text
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _run(command: str, extra: list[str], monkeypatch, capsys) -> str:
    argv = shlex.split(command)[1:] + extra
    if argv[0] == "serve":
        return _serve(argv, Path.cwd())
    if argv[0] == "chat":  # piped: one question, then the end of input
        monkeypatch.setattr(sys, "stdin", io.StringIO("What is 2 + 2?\n/help\n"))
    if argv == ["--help"]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
    else:  # run-agent exits 1 when the agent stopped without an answer (the tiny model never answers)
        assert main(argv) in ((0, 1) if argv[0] == "run-agent" else (0,)), f"{command}: {capsys.readouterr().err[-800:]}"
    return capsys.readouterr().out


# What a command must have done (run in its chain's directory): directory, its output -> bool.
CHECKS: dict[str, Callable[[Path, str], bool]] = {
    "ponder --help": lambda d, out: "export" in out and "PONDER_DEBUG=1" in out,
    "ponder demo --quick": lambda d, out: (d / "runs/demo-quick/results.json").is_file(),
    "ponder train --resume runs/grpo train.steps=30":
        lambda d, out: [json.loads(line)["step"] for line in open(d / "runs/grpo/metrics.jsonl")]
        == [1, 2, 3],
    "ponder eval --recipe recipes/search_qa.yaml --model runs/grpo --episodes 32 --out runs/eval":
        lambda d, out: json.loads((d / "runs/eval/metrics.json").read_text())["model"] == "runs/grpo",
    "ponder report runs/grpo": lambda d, out: "<html" in (d / "runs/grpo/report.html").read_text()[:500].lower(),
    "ponder chat --model runs/grpo --tools calculator": lambda d, out: "/tools" in out,
    "ponder serve --adapter grpo=runs/grpo --port 8000": lambda d, out: json.loads(out)["model"] == "grpo",
    "ponder export runs/grpo --out runs/grpo-hf --merge":
        lambda d, out: (d / "runs/grpo-hf/config.json").is_file(),
}  # fmt: skip
# Commands that read another's output run after it in one directory (README order);
# every other command runs alone, so the chains and the rest spread over test workers.
CHAINS = {"runs/grpo": "grpo"}


def chains() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for command in readme_commands():
        name = next((chain for marker, chain in CHAINS.items() if marker in command), command)
        found.setdefault(name, []).append(command)
    return found


def test_every_check_is_a_readme_command():
    assert set(CHECKS) - set(readme_commands()) == set()


@pytest.mark.parametrize("chain", list(chains()))
def test_readme_commands_run_as_written(chain, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # recipes resolve from any directory
    for command in chains()[chain]:
        output = _run(command, list(COMMANDS[command]), monkeypatch, capsys)
        check = CHECKS.get(command, lambda d, out: True)
        assert check(tmp_path, output), f"{command}: not done as the README says"
