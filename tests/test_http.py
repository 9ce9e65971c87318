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


def test_a_pooled_connection_is_dropped_before_uvicorn_would_close_it() -> None:
    """uvicorn closes a connection idle for `timeout_keep_alive` (5 s); a client that reused one that old could
    meet the close mid-request (ReadError) though the server was fine. So the pool drops idle connections
    sooner: a request after KEEPALIVE_EXPIRY_S of quiet opens a new connection."""
    import uvicorn

    assert http.KEEPALIVE_EXPIRY_S < uvicorn.Config(app=None).timeout_keep_alive
    accepted: list[int] = []

    async def keeps_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(keeps_alive, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        try:
            async with http.async_client() as client:
                assert (await client.get(url)).text == "ok"
                assert (await client.get(url)).text == "ok"  # back to back: the pooled connection is reused
                assert len(accepted) == 1
                await asyncio.sleep(http.KEEPALIVE_EXPIRY_S + 0.5)
                assert (await client.get(url)).text == "ok"
                assert len(accepted) == 2  # httpx's default (5 s) would have reused the idle connection
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())
