"""A free TCP port, for a test that starts a server (or needs an address where nothing listens)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on now (the OS picks it; the socket is closed on return, so a
    server started next can bind it, and until one does, a connection there is refused)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
