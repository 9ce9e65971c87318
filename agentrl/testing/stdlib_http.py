"""An HTTP POST as Python's standard library makes it, for the servers' body-limit tests.

`http.client` (and `urllib.request`, which adds `Connection: close`) sends the whole body before it reads a
byte of the answer, so a server that answers early and closes with the body unread makes the kernel reset the
connection: the client sees ConnectionResetError or BrokenPipeError, never the answer.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

BODY_FILL = b"a"


def oversized_json(size: int) -> bytes:
    """A JSON object of exactly `size` bytes (at least 8): one string field."""
    return b'{"x":"' + BODY_FILL * (size - 8) + b'"}'


def stdlib_post(base_url: str, path: str, body: bytes | Iterable[bytes], headers: dict[str, str] | None = None,
                timeout: float = 300.0) -> tuple[int, dict[str, str], bytes]:
    """POST `body` to `base_url + path` with http.client (an iterable body goes chunked): (status, headers, body). Raises what http.client raises
    (OSError subclasses when the connection is reset before the answer is read)."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"content-type": "application/json", **(headers or {})})
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


def declared_only(base_url: str, path: str, length: int, timeout: float = 300.0) -> bytes:
    """Send a POST's headers declaring a `length`-byte body and none of it; the server's answer as raw bytes
    (b"" when it closed without one). A server that waited for the body would only answer at `timeout`."""
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {length}\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)
