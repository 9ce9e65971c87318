"""HTTP clients for agentrl's own calls: no proxy settings from the environment, one shared TLS context.

httpx builds a new SSL context for every client (loading the CA bundle: ~45 ms of CPU holding the GIL).
A rollout makes a few short-lived clients, so at 32 concurrent plays that was most of a GRPO step; with
one cached context a client costs microseconds.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's default-verification TLS context, made once (sharing one across threads is safe)."""
    return httpx.create_ssl_context()


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` that ignores proxy environment variables and reuses `tls_context()`."""
    kwargs.setdefault("trust_env", False)
    kwargs.setdefault("verify", tls_context())
    return httpx.AsyncClient(**kwargs)
