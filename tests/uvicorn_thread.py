"""A uvicorn server on a background thread, on a loopback port bound beforehand: the
one way every HTTP test here starts its server (binding port 0 ourselves and handing
the socket to uvicorn avoids racing another process for a port picked in advance)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


def loopback_socket() -> socket.socket:
    """A TCP socket bound to a free port on 127.0.0.1 (not listening yet)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serving(server: Any, sock: socket.socket, timeout_s: float = 20.0, must_stop: bool = True) -> Iterator[int]:
    """Run the uvicorn `server` on `sock` from a daemon thread until the block ends;
    yields the port. must_stop: fail when uvicorn has not shut down within timeout_s."""
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()
        assert not (must_stop and thread.is_alive()), "uvicorn did not shut down"
