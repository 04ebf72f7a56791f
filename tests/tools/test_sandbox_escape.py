"""Escape probes against the code jail: each one tries a way out and asserts, on values, that
it stayed in (the host file unchanged, the marker absent, the listener got 0 bytes, the
secret not in the output). Every probe runs through a cold `run_python` jail and through
a warm `SandboxPool` jail. Results: docs/results/safety.md."""

import hashlib
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from ponder.tools.sandbox import SandboxPool, run_python

REPO = Path(__file__).resolve().parents[2]
SECRET = "ponder-test-secret-7f3a9c"
os.environ["PONDER_ESCAPE_TEST_SECRET"] = SECRET  # inherited by anything this process starts


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(size=2, timeout_s=5) as warm:
        yield warm


@pytest.fixture(params=["cold", "pool"])
def run(request, pool):
    if request.param == "cold":
        return lambda code, timeout_s=5.0, **kw: run_python(code, timeout_s=timeout_s, **kw)
    return lambda code, timeout_s=5.0, **kw: pool.run(code, timeout_s=timeout_s)


@pytest.fixture
def host_file(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("host data")
    victim.chmod(0o644)
    return victim


def _try(statement: str) -> str:
    """Code that prints 'ESCAPED <value>' if `statement` works, else 'contained <error class>'."""
    return f"try:\n    value = {statement}\n    print('ESCAPED', repr(value)[:200])\nexcept Exception as error:\n    print('contained', type(error).__name__)\n"


# Prefixed to every probe that would harm the host if it ran there (signals to -1, a fork
# bomb, filling a disk, SysV segments, mounts): outside a jail (a regression, or the suite
# run with PONDER_SANDBOX=weak) the probe stops and its test fails instead of doing damage.
JAILED_ONLY = (
    "import os as _os, sys as _sys\n"
    "if _os.path.exists('/root') or not _os.path.isdir('/scratch') or len([p for p in _os.listdir('/proc') if p.isdigit()]) > 8:\n"
    "    print('ESCAPED: not in a jail, probe not run')\n"
    "    _sys.exit(0)\n"
)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- reading the host ---------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/etc/shadow", "/root/.bash_history", str(REPO / "pyproject.toml"), str(REPO / ".git/config"),
     sys.base_prefix + "/bin/python3"],
)
def test_host_files_cannot_be_read(run, path):
    assert run(_try(f"open({path!r}, 'rb').read()")).stdout.startswith("contained ")


def test_etc_passwd_is_the_jails_own(run):
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()}
    out = run("print(open('/etc/passwd').read())").stdout
    assert {line.split(":")[0] for line in out.split()} == {"root", "sandbox"} and "daemon" in host_users


def test_a_host_folder_given_by_path_is_absent(run, host_file):
    out = run(f"import os\nprint(os.path.exists({str(host_file)!r}), os.path.exists({str(host_file.parent)!r}))").stdout
    assert out == "False False\n"


def test_listing_the_root_shows_only_the_jail(run):
    out = run("import os\nprint(sorted(os.listdir('/')))\nprint(sorted(os.listdir('/etc')))").stdout.splitlines()
    allowed = {"dev", "etc", "lib", "lib32", "lib64", "libx32", "opt", "proc", "scratch", "tmp", "usr"}
    assert set(eval(out[0])) <= allowed and not {"root", "home", "work"} & set(eval(out[0]))
    assert set(eval(out[1])) <= {"group", "ld.so.cache", "passwd"}


def test_the_host_environment_is_not_visible(run):
    # also /proc/1/environ: bubblewrap's init, unreadable as root, empty otherwise
    code = "import os, glob\nprint(dict(os.environ))\nfor p in glob.glob('/proc/*/environ'):\n"
    code += "    try: print(open(p, 'rb').read())\n    except OSError as e: print(p, type(e).__name__)\n"
    result = run(code)
    assert SECRET not in result.stdout and "PONDER_ESCAPE_TEST_SECRET" not in result.stdout
    assert "'HOME': '/scratch'" in result.stdout


def test_host_processes_are_invisible(run):
    out = run("import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))").stdout
    assert int(out) <= 3 < len([p for p in os.listdir("/proc") if p.isdigit()])


def test_a_hard_link_to_a_host_file_is_refused(run, host_file):
    result = run(_try(f"os.link({str(host_file)!r}, 'l')").replace("try:", "import os\ntry:", 1))
    linked = run(_try("os.link('/etc/passwd', 'p') or open('p').read()").replace("try:", "import os\ntry:", 1))
    assert result.stdout.startswith("contained") and linked.stdout.startswith("contained")
    assert host_file.stat().st_nlink == 1


def test_a_symlink_cannot_reach_the_host(run):
    code = "import os\nos.symlink('/etc/shadow', 's')\n" + _try("open('s').read()")
    code += _try("open('/proc/1/root/etc/shadow').read()")
    out = run(code).stdout.splitlines()
    assert out[0] == "contained FileNotFoundError" and out[1] in ("contained PermissionError", "contained FileNotFoundError")


# --- changing the host --------------------------------------------------------------


@pytest.mark.parametrize(
    "action",
    ["os.remove(P)", "os.rename(P, P + '.moved')", "os.chmod(P, 0o777)", "os.truncate(P, 0)",
     "open(P, 'w').write('owned')", "os.utime(P, (0, 0))"],
)
def test_host_files_cannot_be_changed(run, host_file, action):
    before = (host_file.read_text(), host_file.stat().st_mode, host_file.stat().st_mtime)
    out = run(f"import os\nP = {str(host_file)!r}\n" + _try(action)).stdout
    assert out.startswith("contained") and host_file.exists()
    assert (host_file.read_text(), host_file.stat().st_mode, host_file.stat().st_mtime) == before


def test_the_python_installation_and_libraries_are_read_only(run, tmp_path):
    # read-only mounts, checked without writing: a failing jail must not damage the host
    mounts = ["/opt/python", "/opt/site-packages", "/usr/lib", "/etc/passwd", "/etc/ld.so.cache", "/dev"]
    code = "import os\nprint([bool(os.statvfs(m).f_flag & os.ST_RDONLY) for m in %r])\n" % mounts
    code += _try("open('/opt/python/lib/python3.11/os.py', 'a')") + _try("os.chmod('/opt/python', 0o777)")
    out = run(code).stdout.splitlines()
    assert out[0] == str([True] * len(mounts)) and out[1] == "contained PermissionError" and out[2] == "contained OSError"


def test_new_files_outside_scratch_are_refused(run):
    names = [f"{folder}/ponder-escape-{os.getpid()}" for folder in ("/usr/lib", "/opt", "/etc", "/dev/shm", "/")]
    code = "import os\n" + "".join(_try(f"os.open({name!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY)") for name in names)
    try:
        out = run(code).stdout.splitlines()
    finally:
        for name in names:  # only ever there on the host if the jail failed
            Path(name).unlink(missing_ok=True)
    assert len(out) == len(names) and all(line.startswith("contained") for line in out)


def test_dev_holds_only_harmless_devices(run):
    code = "import os\n" + _try("open('/dev/tty')") + "print(sorted(os.listdir('/dev')))\n"
    out = run(code).stdout.splitlines()
    assert out[0].startswith("contained")
    assert not {"vda", "sda", "nvme0n1", "mem", "kmem", "port", "kmsg", "fuse"} & set(eval(out[1]))


def test_kernel_settings_are_not_writable(run):
    # access() only asks: writing these on a host (after a jail failure) could reboot it
    files = ["/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
             "/proc/sys/user/max_user_namespaces", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/kernel/core_pattern"]
    assert run("import os\nprint([os.access(f, os.W_OK) for f in %r])" % files).stdout == str([False] * len(files)) + "\n"


# --- the old sandbox's holes: audit-hook tampering, unaudited process creation ------


def test_tampering_with_main_changes_nothing(run, host_file):
    # the escape that disabled every check of the audit-hook sandbox: blank its globals
    code = "import sys\nm = sys.modules['__main__']\nfor k in list(vars(m)):\n"
    code += "    if not k.startswith('__'): setattr(m, k, None)\n"
    code += _try("open('/etc/shadow').read()") + _try(f"open({str(host_file)!r}, 'w').write('owned')")
    assert run(code).stdout == "contained FileNotFoundError\ncontained FileNotFoundError\n"
    assert host_file.read_text() == "host data"


@pytest.mark.skipif(sys.version_info[:2] not in ((3, 11), (3, 12)), reason="fork_exec's arguments differ by version")
def test_posixsubprocess_fork_exec_is_jailed_too(run):
    # the call subprocess makes in 3.11/3.12, with setsid; it raises no audit event
    code = "import _posixsubprocess, os, sys\nr, w = os.pipe()\ner, ew = os.pipe()\n"
    code += "args = [sys.executable, '-c', 'import os; print(os.getuid(), os.path.exists(\"/work\"), os.path.exists(\"/etc/shadow\"))']\n"
    code += "pid = _posixsubprocess.fork_exec(args, [os.fsencode(sys.executable)], True, (), None, None, -1, -1, -1, w, -1, -1,"
    code += " er, ew, True, True, -1, None, None, None, -1, None, False)\n"
    code += "os.close(w)\nos.waitpid(pid, 0)\nprint(os.read(r, 200).decode().strip())\n"
    result = run(code)
    assert result.stdout == "1000 False False\n", result.stderr


def test_subprocess_has_no_host_programs_and_its_python_is_jailed(run):
    code = "import subprocess, sys\n" + _try("subprocess.run(['id'])") + _try("subprocess.run(['/bin/sh', '-c', 'id'])")
    child = "import os, socket; print(os.getuid(), os.path.exists('/work'), os.path.exists('/root'), socket.if_nameindex())"
    code += f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout, end='')"
    out = run(code).stdout.splitlines()
    assert out == ["contained FileNotFoundError", "contained FileNotFoundError", "1000 False False [(1, 'lo')]"]


def test_os_system_finds_no_shell(run):
    assert run("import os\nprint(os.system('id > /scratch/id.txt'), os.path.exists('/scratch/id.txt'))").stdout == "32512 False\n"


# --- outliving the time limit -----------------------------------------------------------


def test_a_setsid_double_forked_child_dies_at_the_limit(run, tmp_path):
    marker = tmp_path / "marker"
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(1.5)\n"
    code += f"        for p in ({str(marker)!r}, '/scratch/marker'):\n"
    code += "            try: open(p, 'w').write('alive')\n            except OSError: pass\n        os._exit(0)\n    os._exit(0)\n"
    code += "time.sleep(60)\n"
    result = run(code, timeout_s=0.5)
    time.sleep(2.0)  # past the moment the grandchild would have written
    assert result.timed_out and not marker.exists()


def test_a_background_child_of_a_finished_run_is_killed(pool, tmp_path):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(0.8)\n    open('/tmp/late', 'w').write('x')\n"
    code += "    os._exit(0)\nprint('parent done')\n"
    assert pool.run(code).stdout == "parent done\n"
    time.sleep(1.0)
    for _ in range(2):
        assert pool.run("import os\nprint(os.listdir('/tmp'), len([p for p in os.listdir('/proc') if p.isdigit()]))").stdout == "[] 3\n"


def test_the_worker_cannot_be_signalled_or_traced(run):
    code = JAILED_ONLY + "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nppid = os.getppid()\n"
    for statement in ("os.kill(ppid, 9)", "os.kill(-1, 9)", "os.kill(-ppid, 9)", "os.kill(1, 9)", "os.pidfd_open(ppid)"):
        code += _try(statement)
    code += "print(libc.ptrace(0x4206, ppid, None, None), ctypes.get_errno())\n"  # PTRACE_SEIZE
    code += _try("open(f'/proc/{ppid}/mem', 'rb').read(1)")
    code += "print('still here')\n"
    out = run(code).stdout.splitlines()
    assert all(line.startswith("contained") for line in out[:5]) and out[5] == "-1 1"
    assert out[6].startswith("contained") and out[7] == "still here"


def test_host_pids_cannot_be_signalled_or_traced(run):
    host_pid = os.getpid()
    code = "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n" + _try(f"os.kill({host_pid}, 0)")
    code += f"print(libc.ptrace(0x4206, {host_pid}, None, None), ctypes.get_errno())\n"  # PTRACE_SEIZE: never stops it
    assert run(code).stdout == "contained ProcessLookupError\n-1 1\n"


# --- resource exhaustion --------------------------------------------------------------------


def test_a_fork_bomb_stops_at_the_process_limit(run):
    code = JAILED_ONLY + "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
    code += "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n"
    n, errno = run(code, timeout_s=3).stdout.split()
    assert int(n) < 32 and int(errno) == 11  # EAGAIN from RLIMIT_NPROC


def test_a_memory_hog_fails(run):
    code = "blocks = []\ntry:\n    while True: blocks.append(bytearray(10**7))\nexcept MemoryError:\n    print(len(blocks))"
    assert 1 <= int(run(code).stdout) < 26  # 256 MiB of address space, the interpreter's included


def test_children_together_stop_at_the_call_memory_cap(run):
    # Each child stays under its own 256 MiB address space (100 MB resident); four of
    # them together pass the call's cap, and every process of the call is killed.
    code = JAILED_ONLY + "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n"
    code += "        block = bytearray(10**8)\n        block[::4096] = b'x' * len(block[::4096])\n"
    code += "        time.sleep(20)\n        os._exit(0)\nprint('forked', flush=True)\ntime.sleep(20)\n"
    started = time.monotonic()
    result = run(code, timeout_s=15)
    assert result.memory_exceeded and not result.timed_out and time.monotonic() - started < 10
    assert result.render().startswith("killed: the code's processes together used more memory")


def test_one_process_under_the_cap_is_not_stopped(run):
    code = "block = bytearray(10**8)\nblock[::4096] = b'x' * len(block[::4096])\nprint(len(block))"
    result = run(code)
    assert result.stdout == "100000000\n" and not result.memory_exceeded


def test_a_cpu_spin_is_killed_at_the_limit(run):
    started = time.monotonic()
    result = run("while True: pass", timeout_s=1)
    assert result.timed_out and time.monotonic() - started < 3


def test_filling_the_disk_stops_at_the_scratch_cap(run):
    code = JAILED_ONLY + "total = 0\ntry:\n    for i in range(1000):\n        with open(f'f{i}', 'wb') as f:\n"
    code += "            for _ in range(8):\n                f.write(b'x' * 2**20)\n                total += 1\n"
    code += "except OSError as e:\n    print(total, e.errno)\n"
    total, errno = run(code).stdout.split()
    assert int(total) <= 32 and int(errno) == 28  # ENOSPC: 4 x max_file_mb (8 MiB)


def test_one_file_stops_at_the_file_size_cap(run):
    code = "try:\n    open('big', 'wb').write(b'x' * 9 * 2**20)\nexcept OSError as e:\n    print(e.errno)\n"
    assert run(code).stdout == "27\n"  # EFBIG: RLIMIT_FSIZE


def test_memory_outside_the_address_space_limit_is_refused(run):
    code = JAILED_ONLY + "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n" + _try("os.memfd_create('m')")
    code += "print(libc.shmget(0, 1 << 30, 0o1000 | 0o600), ctypes.get_errno())\n"
    code += "print(libc.syscall(425, 8, None), ctypes.get_errno())\n"  # io_uring_setup
    assert run(code).stdout == "contained PermissionError\n-1 1\n-1 1\n"


# --- the network --------------------------------------------------------------------------


@pytest.fixture
def tcp_listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.3)
    yield server
    server.close()


@pytest.fixture
def udp_listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(0.3)
    yield server
    server.close()


def _received(server) -> int:
    try:
        return len(server.recv(65536))
    except (TimeoutError, BlockingIOError):
        return 0


def test_tcp_to_a_host_listener_gets_nowhere(run, tcp_listener):
    port = tcp_listener.getsockname()[1]
    out = run("import socket\n" + _try(f"socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'x')")).stdout
    with pytest.raises(socket.timeout):
        tcp_listener.accept()
    assert out == "contained ConnectionRefusedError\n"


@pytest.mark.parametrize("send", ["s.sendto(b'leak', ADDR)", "s.sendmsg([b'leak'], [], 0, ADDR)", "s.connect(ADDR) or s.send(b'leak')"])
def test_udp_to_a_host_listener_delivers_nothing(run, udp_listener, send):
    address = udp_listener.getsockname()
    code = f"import socket\nADDR = {address!r}\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n" + _try(send)
    run(code)
    assert _received(udp_listener) == 0


def test_only_loopback_exists_and_nothing_is_routable(run):
    code = "import socket\nprint(socket.if_nameindex(), socket.gethostname())\n"
    code += _try("socket.create_connection(('1.1.1.1', 53), timeout=1)") + _try("socket.getaddrinfo('pypi.org', 443)")
    out = run(code).stdout.splitlines()
    assert out[0] == "[(1, 'lo')] sandbox" and out[1] == "contained OSError" and out[2] == "contained gaierror"


def test_a_host_unix_socket_is_unreachable(run, tmp_path):
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0ponder-escape-{os.getpid()}")
    abstract.listen()
    abstract.settimeout(0.3)
    path = str(tmp_path / "s.sock")
    named = socket.socket(socket.AF_UNIX)
    named.bind(path)
    named.listen()
    named.settimeout(0.3)
    code = "import socket\n" + _try(f"socket.socket(socket.AF_UNIX).connect('\\0ponder-escape-{os.getpid()}')")
    code += _try(f"socket.socket(socket.AF_UNIX).connect({path!r})")
    assert run(code).stdout == "contained ConnectionRefusedError\ncontained FileNotFoundError\n"
    for server in (abstract, named):
        with pytest.raises(socket.timeout):
            server.accept()
        server.close()


# --- privileges and kernel surfaces --------------------------------------------------------


def test_no_capabilities_no_new_privileges_and_a_seccomp_filter(run):
    code = "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
    code += "print(status['Uid'].split()[0], status['CapEff'].strip(), status['CapPrm'].strip(), status['NoNewPrivs'].strip(), status['Seccomp'].strip())"
    assert run(code).stdout == "1000 0000000000000000 0000000000000000 1 2\n"


def test_root_cannot_be_regained(run):
    code = "import os\n" + _try("os.setuid(0)") + _try("os.setgid(0)") + _try("os.chroot('/scratch')")
    out = run(code).stdout.splitlines()  # EPERM, or EINVAL where uid 0 is not even mapped (non-root host)
    assert len(out) == 3 and all(line in ("contained PermissionError", "contained OSError") for line in out)


def test_namespaces_and_mounts_are_refused(run):
    code = JAILED_ONLY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nos.mkdir('m')\n"
    code += "print(libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
    code += "print(libc.unshare(0x00020000), ctypes.get_errno())\n"  # CLONE_NEWNS
    code += "print(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0), ctypes.get_errno())\n"  # clone(CLONE_NEWUSER)
    code += "print(libc.mount(b'none', b'm', b'tmpfs', 0, None), ctypes.get_errno())\n"
    code += "print(libc.syscall(155, b'/scratch', b'/scratch/m'), ctypes.get_errno())\n"  # pivot_root
    assert run(code).stdout == "-1 1\n" * 5


def test_ctypes_dlopen_of_a_host_library_finds_only_the_jails(run):
    code = "import ctypes\n" + _try("ctypes.CDLL('/root/.bashrc')") + _try(f"ctypes.CDLL({str(REPO / 'x.so')!r})")
    code += "print(ctypes.CDLL('libc.so.6').getpid() > 0)\n"
    assert run(code).stdout == "contained OSError\ncontained OSError\nTrue\n"


def test_kernel_keyrings_bpf_and_perf_are_refused(run):
    code = JAILED_ONLY + "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    for number, args in ((250, "0, 0"), (321, "0, None, 0"), (298, "None, 0, -1, -1, 0"), (323, "0")):
        code += f"print(libc.syscall({number}, {args}), ctypes.get_errno())\n"  # keyctl, bpf, perf_event_open, userfaultfd
    assert run(code).stdout == "-1 1\n" * 4


def test_no_descriptor_of_the_worker_leaks_into_the_code(run):
    assert run("import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))").stdout == "[0, 1, 2, 3]\n"
