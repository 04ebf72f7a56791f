"""The warm sandbox worker: runs INSIDE the jail (see ponder.tools.jail), stdlib only.

The host starts it as `python -I -S -c <this file's text> <config json>` inside
bubblewrap's namespaces. It drops to the sandbox uid, makes itself non-dumpable (no
ptrace, no /proc/<pid>/mem for the code it runs), then serves requests framed as a
4-byte big-endian length plus JSON on fds 0 (in) and 1 (out):

    {"op": "ping"}                                   -> {"pong": true}
    {"op": "run", "code", "timeout_s", "stdin"}      -> {"exit_code", "stdout", "stderr",
                                                         "timed_out", "elapsed_s"}

Each run is a fresh forked child: its own session, rlimits, a seccomp filter, the
scratch tmpfs wiped before it starts, stdin from a memfd, stdout/stderr into pipes the
worker reads as they fill (only the head is kept, so output never touches the disk). At the
time limit the child is killed, and after every run `kill(-1, SIGKILL)` ends whatever
it left behind: in this PID namespace that is every process but the worker and
bubblewrap's init, so a setsid'd or double-forked grandchild cannot outlive its run.

Memory is capped twice: RLIMIT_AS bounds each process's address space, and while the
run lasts the worker sums the resident memory of every process of the run (the jail's
own /proc lists nothing else) every `_MEMORY_POLL_S` and kills them all once the sum
passes the call's cap, so forked children cannot together hold more than one call may
(a cgroup would be exact, but an unprivileged user namespace gets none to write to).
"""

import json
import os
import select
import shutil
import signal
import struct
import sys
import time

SCRATCH = "/scratch"
SANDBOX_UID = 1000
_MEMORY_POLL_S = 0.02

# seccomp (x86_64 only; elsewhere the namespaces and rlimits stand alone). Syscalls the
# code never needs and that either reach the kernel's riskier surfaces or hold memory
# outside RLIMIT_AS (SysV shm/msg, memfd, userfaultfd, io_uring).
# fmt: off
_X86_64_DENIED = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "swapon": 167, "swapoff": 168,
    "reboot": 169, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248,
    "request_key": 249, "userfaultfd": 323, "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240,
    "io_uring_setup": 425, "memfd_create": 319, "memfd_secret": 447, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "personality": 135, "acct": 163,
    "quotactl": 179, "syslog": 103, "kcmp": 312, "open_by_handle_at": 304, "pidfd_getfd": 438,
    "fanotify_init": 300, "iopl": 172, "ioperm": 173,
}
_X86_64_SIGNALS = {
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "prlimit64": 302, "pidfd_open": 434,
}
_X86_64_CLONE, _X86_64_CLONE3 = 56, 435
_AUDIT_ARCH_X86_64 = 0xC000003E
_NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
# fmt: on


def _bpf(code, jt, jf, k):
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def seccomp_program(protected_pid):
    """A BPF filter: wrong arch -> kill; denied syscalls -> EPERM; clone3 -> ENOSYS (libc
    falls back to clone, whose flags we can read); clone with namespace flags -> EPERM;
    signals, prlimit and pidfd_open aimed at the worker, its group, -1 or init -> EPERM."""
    load, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000
    prog = [
        _bpf(load, 0, 0, 4),
        _bpf(jeq, 1, 0, _AUDIT_ARCH_X86_64),
        _bpf(ret, 0, 0, kill),
        _bpf(load, 0, 0, 0),
    ]
    prog += [_bpf(jge, 0, 1, 0x40000000), _bpf(ret, 0, 0, enosys)]  # the x32 ABI: a second syscall table
    for number in _X86_64_DENIED.values():
        prog += [_bpf(jeq, 0, 1, number), _bpf(ret, 0, 0, eperm)]
    prog += [_bpf(jeq, 0, 1, _X86_64_CLONE3), _bpf(ret, 0, 0, enosys)]
    for number in _X86_64_SIGNALS.values():  # arg0 is the target pid for all of them
        prog += [_bpf(jeq, 0, 7, number), _bpf(load, 0, 0, 16)]
        prog += [_bpf(jeq, 3, 0, protected_pid), _bpf(jeq, 2, 0, -protected_pid), _bpf(jeq, 1, 0, -1)]
        prog += [_bpf(jeq, 0, 1, 1), _bpf(ret, 0, 0, eperm), _bpf(ret, 0, 0, allow)]
    prog += [_bpf(jeq, 0, 3, _X86_64_CLONE), _bpf(load, 0, 0, 16), _bpf(jset, 0, 1, _NAMESPACE_FLAGS)]
    prog += [_bpf(ret, 0, 0, eperm), _bpf(ret, 0, 0, allow)]
    return b"".join(prog)


def _prctl(*args):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4
    if libc.prctl(*args, *([None] * (5 - len(args)))) != 0:
        raise OSError(ctypes.get_errno(), f"prctl{args[:1]} failed")


def install_seccomp(protected_pid):
    """No new privileges, then the filter; skipped off x86_64 (other syscall numbers)."""
    import ctypes

    _prctl(38, 1)  # PR_SET_NO_NEW_PRIVS: exec can never gain privileges
    if os.uname().machine != "x86_64":
        return
    program = seccomp_program(protected_pid)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    prog = SockFprog(len(program) // 8, program)
    _prctl(22, 2, ctypes.addressof(prog))  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def drop_privileges():
    """Become the sandbox uid (a no-op when bubblewrap already started us as it)."""
    if os.getuid() != SANDBOX_UID:
        os.setgroups([])
        os.setgid(SANDBOX_UID)
        os.setuid(SANDBOX_UID)
    _prctl(4, 0)  # PR_SET_DUMPABLE 0: the code we run cannot ptrace us or read our memory


def wipe_scratch():
    """Empty the scratch tmpfs; the code may have left read-only or unsearchable folders."""
    for root, dirs, _ in os.walk(SCRATCH):
        for name in dirs:
            try:
                os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
            except OSError:
                pass
    for name in os.listdir(SCRATCH):
        path = os.path.join(SCRATCH, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def _stdin_file(content):
    # memfd: the worker may (the code may not); stdin does not eat into the scratch cap
    fd = os.memfd_create("stdin")
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _child(code, fds, limits, worker_pid):
    """In the forked child: never returns."""
    import resource

    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        os.chdir(SCRATCH)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with an error instead
        for name, value in limits.items():
            resource.setrlimit(getattr(resource, name), (value, value))
        install_seccomp(worker_pid)
        sys.argv = ["<agent code>"]  # not the worker's settings
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    except BaseException as error:  # the jail itself failed: say so, run nothing
        os.write(2, f"sandbox setup failed: {error!r}\n".encode())
        os._exit(125)
    os._exit(_run_code(code))


def _run_code(code):
    import linecache
    import traceback

    linecache.cache["<agent code>"] = (len(code), None, code.splitlines(True), "<agent code>")
    status = 0
    try:
        exec(compile(code, "<agent code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException as error:
        status = 1
        # tb_next: start at the model's code, not at this function's exec() line
        tb = error.__traceback__.tb_next if error.__traceback__ else None
        traceback.print_exception(type(error), error, tb, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status & 0xFF


class _Output:
    """The head of one output pipe (enough bytes for `limit` characters) and its total size."""

    def __init__(self, fd, limit):
        self.fd, self.limit, self.head, self.size = fd, limit, bytearray(), 0

    def read(self):
        """Read what is there; False at end of file."""
        chunk = os.read(self.fd, 1 << 16)
        self.size += len(chunk)
        keep = self.limit * 4 + 4 - len(self.head)
        if keep > 0:
            self.head += chunk[:keep]
        return bool(chunk)

    def drain(self):
        """After every writer is dead: read to the end."""
        os.set_blocking(self.fd, False)
        try:
            while self.read():
                pass
        except BlockingIOError:
            pass  # a writer we could not kill would be a bug, but never hang the worker on it
        os.close(self.fd)

    def text(self):
        text = self.head.decode("utf-8", errors="replace")
        if len(text) > self.limit or self.size > len(self.head):
            return text[: self.limit] + f"\n…[output cut at {self.limit} characters]"
        return text


def tree_resident_bytes(skip):
    """The resident memory of every process in this PID namespace but `skip` (pids)."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/statm", "rb") as statm:
                total += int(statm.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass  # it exited while we looked
    return total


def _wait(pid, outputs, timeout_s, memory_bytes):
    """Collect output until the child exits, the limit passes or the run's processes
    together hold more than `memory_bytes`; returns "timeout", "memory" or None."""
    pidfd = os.pidfd_open(pid)
    deadline = time.monotonic() + max(timeout_s, 0)
    reading = {output.fd: output for output in outputs}
    skip = {1, os.getpid()}  # bubblewrap's init and this worker
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.kill(pid, signal.SIGKILL)
                return "timeout"
            ready, _, _ = select.select([pidfd, *reading], [], [], min(remaining, _MEMORY_POLL_S))
            for fd in ready:
                if fd != pidfd and not reading[fd].read():
                    del reading[fd]
            if pidfd in ready:
                return None
            if tree_resident_bytes(skip) > memory_bytes:
                os.kill(-1, signal.SIGKILL)  # every process of the run; run() reaps them
                return "memory"
    finally:
        os.close(pidfd)


def kill_everything_else():
    """SIGKILL every process in the namespace but us and init, until none is left."""
    for _ in range(1000):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.001)  # what remains are zombies being reaped by init


def run(request, config):
    """One request: fresh scratch, fork, limits, wait, kill the rest, collect output."""
    wipe_scratch()
    stdin = _stdin_file(request.get("stdin", "").encode())
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    limits = dict(config["limits"], RLIMIT_CPU=int(request["timeout_s"]) + 1)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(request["code"], (stdin, out_w, err_w), limits, os.getppid())
    for fd in (stdin, out_w, err_w):
        os.close(fd)
    outputs = [_Output(out_r, config["max_output_chars"]), _Output(err_r, config["max_output_chars"])]
    stopped = _wait(pid, outputs, float(request["timeout_s"]), config["tree_memory_bytes"])
    _, status = os.waitpid(pid, 0)
    elapsed = time.monotonic() - started
    kill_everything_else()
    for output in outputs:
        output.drain()
    return {
        "exit_code": os.waitstatus_to_exitcode(status),
        "stdout": outputs[0].text(),
        "stderr": outputs[1].text(),
        "timed_out": stopped == "timeout",
        "memory_exceeded": stopped == "memory",
        "elapsed_s": elapsed,
    }


def _read_exact(fd, count):
    data = b""
    while len(data) < count:
        chunk = os.read(fd, count - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _send(fd, message):
    body = json.dumps(message).encode()
    os.write(fd, struct.pack(">I", len(body)) + body)


def serve(config):
    # The protocol gets its own fds; 0 and 1 become /dev/null so nothing else writes into it.
    requests, replies = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    _send(replies, {"ready": True, "uid": os.getuid(), "pid": os.getpid()})
    while True:
        try:
            (length,) = struct.unpack(">I", _read_exact(requests, 4))
            request = json.loads(_read_exact(requests, length))
        except EOFError:
            return
        if request["op"] == "ping":
            _send(replies, {"pong": True})
        else:
            _send(replies, run(request, config))


if __name__ == "__main__":
    drop_privileges()
    os.umask(0o077)
    settings = json.loads(sys.argv[1])
    if settings["site_packages"]:
        import site

        for folder in settings["site_packages"]:  # installed packages (numpy …), read-only
            site.addsitedir(folder)
    serve(settings)
