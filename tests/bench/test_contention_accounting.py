"""bench/vllm_vs_ponder.py's scheduler accounting: the CPU and run-queue seconds of the
process (or server process group) whose generation it times, read from the kernel."""

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from bench.vllm_vs_ponder import schedstat

# spins `s` CPU seconds, then says so in a file and sleeps
SPIN = "import time\nwhile time.process_time() < {s}: pass\nopen({done!r}, 'w').close()\ntime.sleep(60)"


def test_this_process_is_charged_its_own_cpu_time():
    run, wait = schedstat(SimpleNamespace())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    run_after, wait_after = schedstat(SimpleNamespace())
    assert 0.28 < run_after - run < 1.0 and wait_after >= wait


def test_a_server_is_charged_its_whole_process_group_not_this_process(tmp_path):
    # a parent and its child in a new session, each spinning 0.4 CPU seconds
    child = SPIN.format(s=0.4, done=str(tmp_path / "child"))
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\n"
    parent = SPIN.format(s=0.4, done=str(tmp_path / "parent"))
    server = subprocess.Popen([sys.executable, "-c", code + parent], start_new_session=True)
    try:
        mine = time.process_time()
        deadline = time.time() + 30
        done = [tmp_path / "child", tmp_path / "parent"]
        while not all(path.exists() for path in done) and time.time() < deadline:
            time.sleep(0.05)
        run, _ = schedstat(SimpleNamespace(server=SimpleNamespace(process=server)))
        assert 0.8 <= run < 1.3  # 0.8 s of spinning and two interpreters' start-up
        assert time.process_time() - mine < 0.3  # not this process's time
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
