"""The test program that runs inside the sandbox: ponder.envs.code_harness sends this
file's text followed by `main(sys.stdin.read())`.

Standard library only: the sandbox's interpreter is isolated (`python -I`) and cannot
import ponder. The job comes on stdin as JSON: {"nonce", "code", "function", "tests":
[{"args", "expected"}], "per_test_s", "report", "max_chars"}. The program imports the
candidate code, calls the function on every test, and writes one summary line,
`<nonce> <json>`, then ends the process at once.

Why it is built this way (the candidate code is hostile):
- The nonce comes on stdin, never in the program text, so printed text cannot
  carry it: a fake summary line is ignored. The candidate's prints go to a capped
  in-memory sink, so megabytes of output cannot push the summary out of the
  sandbox's output limit either.
- Each import and test call runs under an alarm that raises a BaseException
  subclass (`except Exception` in the candidate cannot swallow it), so one endless
  test costs one test, not the whole run; the sandbox's wall clock is the backstop.
- Results are compared as plain JSON values built with exact type checks: an
  object whose `__eq__` always says True, or True standing in for 1, does not pass.
- `os._exit` right after the summary: the candidate's atexit handlers and threads
  never run after it.
Frame and gc introspection can still reach this program's locals; the sandbox, not
this program, is the security boundary.
"""

import json
import os
import signal
import sys
import traceback


TIMED_OUT = "timed out"


class TestTimeout(BaseException):
    """Raised by the alarm; a BaseException so that `except Exception` does not catch it."""


class Sink:
    """Where the candidate's prints go: the first `limit` characters are kept."""

    def __init__(self, limit):
        self.parts, self.size, self.limit = [], 0, limit

    def write(self, text):
        text = str(text)
        if self.size < self.limit:
            self.parts.append(text[: self.limit - self.size])
        self.size += len(text)
        return len(text)

    def flush(self):
        pass

    def text(self):
        kept = "".join(self.parts)
        return kept + ("\n…[output cut]" if self.size > self.limit else "")


def plain(value, depth=0):
    """`value` as a JSON value, with exact types (tuples become lists); TypeError otherwise."""
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise TypeError("returned a float that is not finite")
        return value
    if depth > 32:
        raise TypeError("returned a value nested too deeply")
    if kind in (list, tuple):
        return [plain(item, depth + 1) for item in value]
    if kind is dict:
        return {_key(k): plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"returned an object of type {kind.__name__}, not a plain value")


def _key(key):
    if type(key) is not str:
        raise TypeError("returned a dict with a key that is not a string")
    return key


def short(text, limit=160):
    return text if len(text) <= limit else text[:limit] + "…"


def describe(error):
    """One line for an exception the candidate raised, with its line in the candidate's code."""
    try:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = type(error).__name__
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == "<solution>"]
    return short(text) + (f" (line {lines[-1]})" if lines else "")


def guarded(call, seconds):
    """(value, None) or (None, error text): `call()` under an alarm of `seconds`."""
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return call(), None
    except TestTimeout:
        return None, TIMED_OUT
    except BaseException as error:  # noqa: BLE001 - SystemExit, KeyboardInterrupt … from the candidate
        return None, describe(error)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def run_test(function, test, seconds, report):
    """One test's record: {"ok"} plus, in report mode, what came back."""
    value, error = guarded(lambda: plain(function(*test["args"])), seconds)
    ok = error is None and json.dumps(value, sort_keys=True) == json.dumps(test["expected"], sort_keys=True)
    record = {"ok": ok}
    if error is not None:
        record["error"] = error
    elif report:
        record["got"] = short(repr(value))
    return record


def load(code, name, seconds):
    """(the candidate's function, None) or (None, why not)."""
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    _, error = guarded(lambda: exec(compile(code, "<solution>", "exec"), namespace), seconds)
    if error is not None:
        return None, error
    function = namespace.get(name)
    if not callable(function):
        return None, f"the code defines no function named {name}"
    return function, None


def main(job_text):
    job = json.loads(job_text)
    out, tests, seconds = sys.stdout, job["tests"], job["per_test_s"]
    sink = Sink(job["max_chars"])
    signal.signal(signal.SIGALRM, _raise_timeout)
    sys.stdout = sys.stderr = sink
    results = []
    try:
        function, load_error = load(job["code"], job["function"], seconds)
        for test in tests:
            try:
                record = run_test(function, test, seconds, job["report"]) if function else {"ok": False}
            except BaseException as error:  # noqa: BLE001 - e.g. an alarm that fired in between
                record = {"ok": False, "error": describe(error)}
            results.append(record)
    except BaseException as error:  # noqa: BLE001 - the candidate broke the harness itself
        load_error = describe(error)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout, sys.stderr = out, sys.__stderr__
    summary = {"load_error": load_error, "results": results, "stdout": sink.text() if job["report"] else ""}
    out.write("\n" + job["nonce"] + " " + json.dumps(summary) + "\n")
    out.flush()
    os._exit(0)


def _raise_timeout(signum, frame):
    raise TestTimeout()
