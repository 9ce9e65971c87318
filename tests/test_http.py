"""agentrl's HTTP clients share one TLS context (httpx would load the CA bundle for every client)."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from agentrl import http


def test_clients_share_one_tls_context_and_ignore_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counting(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would break loopback calls if honoured
    http.tls_context.cache_clear()
    try:
        clients = [http.async_client() for _ in range(5)]
        assert len(made) == 1
        assert all(not c.trust_env for c in clients)

        async def close_all() -> None:
            await asyncio.gather(*(c.aclose() for c in clients))

        asyncio.run(close_all())
    finally:
        http.tls_context.cache_clear()
