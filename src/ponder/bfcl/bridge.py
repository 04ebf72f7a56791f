"""Talk to BFCL's own prompt builder and AST checker in bfcl-eval's virtual environment.

bfcl-eval pins old libraries (numpy 1.26, faiss 1.11 …) and its checker imports its
model handlers, so it lives in its own venv (`make bfcl-venv`). `BfclBridge` starts
`worker.py` there once and exchanges JSON lines with it; ponder's environment never
imports bfcl-eval.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ponder.bfcl.data import DEFAULT_VENV, BfclDataError, resolve_venv

WORKER = Path(__file__).with_name("worker.py")


def bfcl_python(venv: str | os.PathLike[str] = DEFAULT_VENV) -> Path:
    """The venv's interpreter; a one-line error saying how to create it when missing."""
    python = resolve_venv(venv) / "bin" / "python"
    if not python.exists():
        raise BfclDataError(f"no bfcl-eval environment at {venv}; create it with `make bfcl-venv`")
    return python


class BfclBridge:
    """A running worker; use as a context manager (`with BfclBridge() as bfcl: ...`)."""

    def __init__(self, venv: str | os.PathLike[str] = DEFAULT_VENV, timeout_s: float = 900.0) -> None:
        self.python = bfcl_python(venv)
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> BfclBridge:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        # bfcl-eval keeps results, scores and a .env under its project root; an empty
        # directory of ponder's own keeps it from writing into its site-packages.
        env.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "ponder-bfcl-root"))
        Path(env["BFCL_PROJECT_ROOT"]).mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [str(self.python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env,
        )
        self.request({"op": "ping"})
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._process is not None:
            if self._process.stdin:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise RuntimeError("the BFCL worker is not running; use BfclBridge as a context manager")
        process.stdin.write(json.dumps(payload) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise BfclDataError(f"the BFCL worker exited (code {process.poll()}); run {self.python} {WORKER} to see why")
        reply = json.loads(line)
        if "error" in reply:
            raise BfclDataError(f"BFCL worker: {reply['error']}")
        return reply

    def prompts(self, category: str, entries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """BFCL's chat for each entry ({"id", "question", "function"})."""
        return self.request({"op": "prompt", "category": category, "entries": entries})["messages"]

    def check(self, category: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """BFCL's verdict for each item ({"id", "text", "function", "ground_truth"})."""
        return self.request({"op": "check", "category": category, "items": items})["results"]
