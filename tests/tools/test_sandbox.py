import time

import pytest

from ponder.tools.sandbox import run_python


def test_output_and_exit_code():
    result = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err", False)


def test_infinite_loop_is_killed_at_the_time_limit():
    started = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1)
    assert result.timed_out and time.monotonic() - started < 3


def test_a_child_process_cannot_outlive_the_limit():
    result = run_python("import os\nos.fork()\nwhile True: pass", timeout_s=1)
    assert "os.fork is not allowed" in result.stderr


def test_memory_bomb_hits_the_memory_limit():
    result = run_python("x = bytearray(2 * 1024 ** 3)", memory_mb=256)
    assert result.exit_code == 1 and result.stderr.endswith("MemoryError")


@pytest.mark.parametrize(
    "code, refused",
    [
        ("open('/etc/passwd').read()", "reading /etc/passwd is not allowed"),
        ("open('/tmp/ponder-sandbox-escape', 'w')", "writing /tmp/ponder-sandbox-escape is not allowed"),
        ("import os\nos.system('true')", "os.system is not allowed"),
        ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen is not allowed"),
        ("import socket\nsocket.socket().connect(('127.0.0.1', 9))", "socket.connect is not allowed"),
        ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "resource.setrlimit is not allowed"),
    ],
)
def test_forbidden_operations(code, refused):
    result = run_python(code)
    assert result.exit_code == 1 and refused in result.stderr


def test_scratch_files_and_imports_work():
    result = run_python("import json, math\nopen('a.txt', 'w').write('x')\nprint(open('a.txt').read(), math.floor(2.5))")
    assert result.stdout == "x 2\n"


def test_endless_output_is_bounded():
    result = run_python("while True:\n    print('y' * 1000)", timeout_s=3, max_output_chars=2000, max_file_mb=1)
    assert len(result.stdout) < 2100 and result.stdout.endswith("[output cut at 2000 characters]")
