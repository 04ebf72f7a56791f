"""The sandbox's behaviour for ordinary code, the warm pool, and the weak opt-in.
Escape attempts live in test_sandbox_escape.py."""

import os
import signal
import threading
import time

import pytest

from ponder.tools import jail
from ponder.tools.sandbox import SandboxPool, SandboxUnavailableError, run_python


def test_output_and_exit_code():
    result = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err", False)


def test_a_traceback_shows_the_models_lines_only():
    result = run_python("x = 1\n1 / 0")
    lines = result.stderr.splitlines()
    assert result.exit_code == 1 and lines[0] == "Traceback (most recent call last):"
    assert lines[1:3] == ['  File "<agent code>", line 2, in <module>', "    1 / 0"]
    assert lines[-1] == "ZeroDivisionError: division by zero"


def test_infinite_loop_is_killed_at_the_time_limit():
    started = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1)
    assert result.timed_out and result.exit_code == -signal.SIGKILL and time.monotonic() - started < 3


def test_a_child_process_is_killed_with_the_code():
    result = run_python("import os\nif os.fork() == 0:\n    while True: pass\nwhile True: pass", timeout_s=1)
    assert result.timed_out and 1.0 <= result.elapsed_s < 2.0


def test_memory_bomb_hits_the_memory_limit():
    result = run_python("x = bytearray(2 * 1024 ** 3)", memory_mb=256)
    assert result.exit_code == 1 and result.stderr.endswith("MemoryError")


@pytest.mark.parametrize(
    "code, error",
    [
        ("open('/etc/shadow').read()", "FileNotFoundError: [Errno 2] No such file or directory: '/etc/shadow'"),
        ("open('/opt/python/ponder-escape', 'w')", "OSError: [Errno 30] Read-only file system: '/opt/python/ponder-escape'"),
        ("import subprocess\nsubprocess.run(['true'])", "FileNotFoundError: [Errno 2] No such file or directory: 'true'"),
        ("import socket\nsocket.create_connection(('1.1.1.1', 53))", "OSError: [Errno 101] Network is unreachable"),
        ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "ValueError: not allowed to raise maximum limit"),
    ],
)
def test_what_the_jail_refuses(code, error):
    result = run_python(code)
    assert result.exit_code == 1 and result.stderr.splitlines()[-1] == error


def test_root_is_out_of_reach():
    # EPERM as root (uid 0 is mapped, for bubblewrap only); EINVAL elsewhere (not mapped at all)
    last = run_python("import os\nos.setuid(0)").stderr.splitlines()[-1]
    assert last in ("PermissionError: [Errno 1] Operation not permitted", "OSError: [Errno 22] Invalid argument")


def test_scratch_files_tmp_and_imports_work():
    code = "import json, math, tempfile\nopen('a.txt', 'w').write('x')\nf = tempfile.NamedTemporaryFile(dir='/tmp')\n"
    code += "print(open('a.txt').read(), math.floor(2.5), f.name.startswith('/tmp/'))"
    assert run_python(code).stdout == "x 2 True\n"


def test_installed_packages_are_importable():
    pytest.importorskip("numpy")
    assert run_python("import numpy\nprint(int(numpy.arange(4).sum()))").stdout == "6\n"


def test_endless_output_is_bounded():
    result = run_python("while True:\n    print('y' * 1000)", timeout_s=2, max_output_chars=2000, max_file_mb=1)
    assert len(result.stdout) < 2100 and result.stdout.endswith("[output cut at 2000 characters]")


# --- the warm pool -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(size=2, timeout_s=5) as warm:
        yield warm


def test_pool_runs_code_with_stdin(pool):
    result = pool.run("import sys\nprint(sys.stdin.read().upper())", stdin="hello")
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "HELLO\n", False)


def test_pool_serves_two_threads_at_once(pool):
    results = {}

    def call(name):
        results[name] = pool.run(f"import time\ntime.sleep(1)\nprint('{name}')")

    started = time.monotonic()
    threads = [threading.Thread(target=call, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {name: result.stdout for name, result in results.items()} == {"a": "a\n", "b": "b\n"}
    assert time.monotonic() - started < 1.9  # both slept at the same time, in two jails


def test_pool_wipes_scratch_between_runs(pool):
    for _ in range(3):  # whichever jail a run lands in, it saw a fresh scratch
        assert pool.run("import os\nprint(os.listdir('.'))\nopen('left.txt', 'w').write('x')").stdout == "[]\n"


def test_a_timeout_does_not_poison_the_next_run(pool):
    leftovers = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True: open('spam', 'a').write('x')\n"
    result = pool.run(leftovers + "time.sleep(60)", timeout_s=0.5)
    assert result.timed_out
    for _ in range(2):
        after = pool.run("import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]), os.listdir('.'))")
        assert after.stdout == "3 []\n"  # bubblewrap's init, the worker, this code: nothing left over


def _jails(pool):
    return [future.result() for future in list(pool._idle.queue)]


def test_a_killed_worker_is_replaced(pool):
    for warm in _jails(pool):
        os.killpg(warm._process.pid, signal.SIGKILL)
        warm._process.wait()
    for _ in range(3):
        assert pool.run("print(6 * 7)").stdout == "42\n"


def test_a_stuck_worker_is_killed_and_replaced(monkeypatch):
    monkeypatch.setattr(jail, "ANSWER_GRACE_S", 0.5)
    with SandboxPool(size=1) as single:
        (before_use,) = _jails(single)
        os.kill(before_use.worker_pid, signal.SIGSTOP)
        assert single.run("print(1)").stdout == "1\n"  # the health check found it silent
        assert not before_use.alive
        (during_run,) = _jails(single)
        threading.Timer(0.3, os.kill, (during_run.worker_pid, signal.SIGSTOP)).start()
        stuck = single.run("import time\ntime.sleep(1)", timeout_s=1)
        assert stuck.timed_out and stuck.stderr == "sandbox: the jailed worker stopped answering"
        assert 1.5 <= stuck.elapsed_s < 2.5 and not during_run.alive
        assert single.run("print(2)").stdout == "2\n"


# --- without a jail -------------------------------------------------------------------


def test_no_jail_means_a_refusal_unless_weak_is_chosen(monkeypatch):
    monkeypatch.setenv("PONDER_BWRAP", "/nonexistent/bwrap")
    monkeypatch.delenv("PONDER_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailableError) as refused:
        run_python("print(1)")
    message = str(refused.value)
    assert "\n" not in message and "no bubblewrap binary at /nonexistent/bwrap" in message
    assert "PONDER_SANDBOX=weak" in message
    with pytest.raises(SandboxUnavailableError):
        SandboxPool(size=1)
    assert run_python("print(1)", isolation="weak").stdout == "1\n"
    monkeypatch.setenv("PONDER_SANDBOX", "weak")
    assert run_python("import os\nos.fork()").stderr.endswith("PermissionError: sandbox: os.fork is not allowed")
    with SandboxPool(size=1) as weak_pool:
        assert weak_pool.run("print(input())", stdin="w").stdout == "w\n"


@pytest.mark.parametrize(
    "code, refused",
    [
        ("open('/etc/passwd').read()", "reading /etc/passwd is not allowed"),
        ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen is not allowed"),
        ("import socket\nsocket.socket().connect(('127.0.0.1', 9))", "socket.connect is not allowed"),
    ],
)
def test_the_weak_sandbox_keeps_its_audit_hook(code, refused):
    result = run_python(code, isolation="weak")
    assert result.exit_code == 1 and refused in result.stderr
