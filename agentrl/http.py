"""HTTP clients for agentrl's own calls: no proxy settings from the environment, one shared TLS context.

httpx builds a new SSL context for every client (loading the CA bundle: ~45 ms of CPU holding the GIL).
A rollout makes a few short-lived clients, so at 32 concurrent plays that was most of a GRPO step; with
one cached context a client costs microseconds.

Pooled connections are dropped after `KEEPALIVE_EXPIRY_S` idle, below the 5 s after which uvicorn (our servers,
vLLM's, SGLang's) closes an idle one: with httpx's default of 5 s a request could reuse a connection the server was
closing at that moment and fail with ReadError / RemoteProtocolError though the server was fine (seen between GRPO
steps: a vLLM play failed 503 and the dependency watch warned).
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx

KEEPALIVE_EXPIRY_S = 2.0


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's default-verification TLS context, made once (sharing one across threads is safe)."""
    return httpx.create_ssl_context()


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` that ignores proxy environment variables and reuses `tls_context()`."""
    kwargs.setdefault("trust_env", False)
    kwargs.setdefault("verify", tls_context())
    kwargs.setdefault("limits", httpx.Limits(max_connections=100, max_keepalive_connections=20,
                                             keepalive_expiry=KEEPALIVE_EXPIRY_S))
    return httpx.AsyncClient(**kwargs)
