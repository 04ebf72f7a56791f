"""The WEAK sandbox: opt-in only (`PONDER_SANDBOX=weak` or `isolation="weak"`), for hosts
without user namespaces. Not a jail: an audit found most escape probes succeed against it
(the hook's own globals can be overwritten; `_posixsubprocess.fork_exec` raises no audit
event; files outside the scratch folder can be removed, linked, renamed). Use
ponder.tools.sandbox's default (bubblewrap) isolation for untrusted code.

Layers, each bounded on its own:
- a fresh interpreter (`python -I`: no user site, no PYTHON* variables) in a new
  session, killed with its whole process group when the wall-clock limit passes;
- resource limits set in the child before the code runs: address space (memory),
  CPU seconds, size of any written file;
- an audit hook (PEP 578) in the child that refuses to start processes, open
  sockets, load native libraries through ctypes, change resource limits, or open
  files outside its scratch folder (reads of the Python installation are allowed);
- output goes to files in the scratch folder and only the first `max_output_chars`
  characters come back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ponder.tools.jail import SandboxResult

# Runs in the child: set limits, install the audit hook, then run the user's file.
_PRELUDE = r"""
import os, resource, signal, sys
work, code_path, mem, cpu, fsize = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with an error instead
readable = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.__file__))})
work = os.path.realpath(work)
write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
blocked = ("subprocess.Popen", "os.system", "os.fork", "os.forkpty", "pty.spawn", "socket.connect", "socket.bind",
           "socket.sendto", "ctypes.dlopen", "ctypes.dlsym", "resource.setrlimit", "resource.prlimit", "os.kill", "os.killpg")
def inside(path, root):
    return path == root or path.startswith(root + os.sep)
def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        full = os.path.realpath(os.fsdecode(path))
        writing = bool(mode and any(c in str(mode) for c in "wax+")) or bool((flags or 0) & write_flags)
        if inside(full, work) or (not writing and any(inside(full, root) for root in readable)):
            return
        raise PermissionError(f"sandbox: {'writing' if writing else 'reading'} {full} is not allowed")
    if event in blocked or event.startswith(("os.exec", "os.posix_spawn", "os.spawn")):
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(hook)
del hook
source = open(code_path, encoding="utf-8").read()
exec(compile(source, "<agent code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


def run_weak(
    code: str, timeout_s: float, memory_mb: int, max_output_chars: int, max_file_mb: int, stdin: str = ""
) -> SandboxResult:
    """Run `code` in a fresh, limited Python process inside a scratch folder; see module docstring."""
    with tempfile.TemporaryDirectory(prefix="ponder-sandbox-") as work:
        code_path = Path(work) / "main.py"
        code_path.write_text(code, encoding="utf-8")
        out_path, err_path, in_path = Path(work) / ".stdout", Path(work) / ".stderr", Path(work) / ".stdin"
        in_path.write_text(stdin, encoding="utf-8")
        limits = [str(memory_mb * 2**20), str(max(1, int(timeout_s) + 1)), str(max_file_mb * 2**20)]
        command = [sys.executable, "-I", "-c", _PRELUDE, work, str(code_path), *limits]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        started = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(in_path, "rb") as given:
            process = subprocess.Popen(
                command, cwd=work, env=env, stdin=given, stdout=out, stderr=err, start_new_session=True
            )
            timed_out = False
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(process)
        elapsed = time.monotonic() - started
        stdout = _read_head(out_path, max_output_chars)
        stderr = _read_head(err_path, max_output_chars)
        return SandboxResult(process.returncode, stdout, _short_traceback(stderr), timed_out, elapsed)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _read_head(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        data = handle.read(limit * 4 + 4)
    text = data.decode("utf-8", errors="replace")
    if len(text) > limit or path.stat().st_size > len(data):
        return text[:limit] + f"\n…[output cut at {limit} characters]"
    return text


def _short_traceback(stderr: str) -> str:
    """Drop the sandbox's own frames from a traceback: the model needs its code's lines."""
    lines = [line for line in stderr.splitlines() if '"<string>"' not in line]
    return "\n".join(lines)
