"""Run candidate code against unit tests in the sandbox and read back a trustworthy result.

One sandbox run per check: the test program (ponder.envs.code_child) gets the
candidate code, the tests and a fresh random nonce on stdin, runs every test and
prints one summary line that starts with the nonce. Only that line counts: a missing
or malformed one (the process crashed, ran out of time or memory, exited early, or
flooded its output) scores every test as failed, and a line the candidate printed
cannot carry the nonce.

The sandbox is ponder.tools.sandbox.SandboxPool: warm jails (bubblewrap namespaces,
rlimits, seccomp), each run a fresh forked child with the job on its stdin, so a
rollout pays no process start per check.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.envs.code_tasks import call_text
from ponder.tools.sandbox import SandboxPool, SandboxResult

# The test program, called explicitly: a sandbox need not run it as __main__.
CHILD_PROGRAM = Path(__file__).with_name("code_child.py").read_text(encoding="utf-8") + "\nmain(sys.stdin.read())\n"
# What one summary may carry back: every test's record plus the captured prints.
SUMMARY_CHARS = 16_000
# Share of the run's time limit the tests may use; the rest pays for starting the
# interpreter and writing the summary, so a slow test fails alone.
TEST_TIME_SHARE = 0.8


@dataclass
class SandboxSettings:
    """Limits of every run: wall clock, address space, output and written-file sizes; pool size."""

    timeout_s: float = 5.0
    memory_mb: int = 256
    pool_size: int = 2
    max_output_chars: int = SUMMARY_CHARS + 2_000
    max_file_mb: int = 8


def make_sandbox(settings: SandboxSettings) -> SandboxPool:
    """A pool of warm jails with these limits (SandboxUnavailableError where no jail can start)."""
    s = settings
    return SandboxPool(size=s.pool_size, timeout_s=s.timeout_s, memory_mb=s.memory_mb,
                       max_output_chars=s.max_output_chars, max_file_mb=s.max_file_mb)  # fmt: skip


class SharedSandbox:
    """One sandbox shared by every episode of an environment: started by the first
    `get` and closed by `close`, when the last holder lets go of it, or at exit."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self._sandbox: SandboxPool | None = None
        self._close: weakref.finalize | None = None
        self._lock = threading.Lock()

    def get(self) -> SandboxPool:
        with self._lock:
            if self._sandbox is None:
                self._sandbox = make_sandbox(self.settings)
                # The finaliser holds the sandbox, not `self`: it runs when `self` is
                # collected, and at exit (weakref.finalize's atexit hook).
                self._close = weakref.finalize(self, self._sandbox.close)
            return self._sandbox

    def close(self) -> None:
        with self._lock:
            if self._close is not None:
                self._close()
                self._sandbox = None


@dataclass
class CheckReport:
    """What a check found. `failure`: why no trustworthy summary came back (then every
    test failed); `load_error`: the code did not import or has no such function."""

    total: int
    results: list[dict[str, Any]] = field(default_factory=list)
    load_error: str | None = None
    stdout: str = ""
    failure: str | None = None
    elapsed_s: float = 0.0

    @property
    def passed(self) -> int:
        return sum(1 for r in self.results[: self.total] if r.get("ok") is True)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def run_tests(
    sandbox: SandboxPool, code: str, function: str, tests: list[dict[str, Any]], timeout_s: float,
    report: bool = False, max_chars: int = 2_000,
) -> CheckReport:  # fmt: skip
    """Run `function` of `code` on `tests` ({"args", "expected"}) in one sandbox run.
    report=True also brings back what each call returned and the code's prints (the
    first max_chars characters), for showing to the model."""
    nonce = secrets.token_hex(16)
    per_test_s = max(0.05, TEST_TIME_SHARE * timeout_s / (len(tests) + 1))
    job = {"nonce": nonce, "code": code, "function": function, "tests": tests, "per_test_s": per_test_s,
           "report": report, "max_chars": max_chars}  # fmt: skip
    result = sandbox.run(CHILD_PROGRAM, timeout_s=timeout_s, stdin=json.dumps(job))
    summary = read_summary(result.stdout, nonce)
    if summary is None:
        return CheckReport(len(tests), failure=_failure(result), elapsed_s=result.elapsed_s)
    results = [r for r in summary["results"] if isinstance(r, dict)]
    return CheckReport(len(tests), results, summary.get("load_error"), str(summary.get("stdout") or ""),
                      elapsed_s=result.elapsed_s)  # fmt: skip


def read_summary(stdout: str, nonce: str) -> dict[str, Any] | None:
    """The summary on the last line that starts with `nonce`, or None when there is none or it is malformed."""
    lines = [line for line in io.StringIO(stdout) if line.startswith(nonce + " ")]
    if not lines:
        return None
    try:
        summary = json.loads(lines[-1][len(nonce) + 1 :])
    except json.JSONDecodeError:
        return None
    if not isinstance(summary, dict) or not isinstance(summary.get("results"), list):
        return None
    return summary


def _failure(result: SandboxResult) -> str:
    """Why a run gave no summary, as the model should read it."""
    if result.timed_out:
        return f"the code ran past the time limit ({result.elapsed_s:.1f} s) and was stopped"
    tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
    detail = f": {tail[0][:200]}" if tail else ""
    return (f"no test results came back (exit code {result.exit_code}): the code exited, crashed or flooded "
            f"its output before the tests finished{detail}")  # fmt: skip


# Text the model's own program printed must not open or close a protocol tag.
_TAG = re.compile(r"<(/?)\s*(output|run|answer|think)\s*>", re.IGNORECASE)


def neutralise_tags(text: str) -> str:
    """`<answer>` → `&lt;answer>`: shown as text, never read as the protocol."""
    return _TAG.sub(lambda m: "&lt;" + m.group(0)[1:], text)


def render_report(report: CheckReport, function: str, tests: list[dict[str, Any]]) -> str:
    """The outcome of a `<run>` as the model reads it: each example's call, result and
    expected value, the code's prints, or why it did not run."""
    if report.failure is not None:
        return neutralise_tags(report.failure)
    if report.load_error is not None:
        return neutralise_tags(f"the code did not load: {report.load_error}")
    lines = []
    for index, test in enumerate(tests):
        record = report.results[index] if index < len(report.results) else {"ok": False, "error": "not run"}
        call = call_text(function, test["args"])
        error = record.get("error")
        if error == "timed out":
            outcome = "ran past its time limit"
        else:
            outcome = f"raised {error}" if error is not None else f"returned {record.get('got', '?')}"
        verdict = "ok" if record.get("ok") is True else "wrong"
        lines.append(f"{call} {outcome}, expected {test['expected']!r}: {verdict}")
    if report.stdout:
        lines.append("printed:\n" + report.stdout.rstrip("\n"))
    return neutralise_tags("\n".join(lines))
