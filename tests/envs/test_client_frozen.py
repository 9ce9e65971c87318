"""EpisodeClient against a frozen env server: the port takes TCP connections (the kernel's backlog) but the
process never answers. A reset gives up after `connect_timeout` as unreachable, naming the silent handshake;
it used to retry until the whole `reset_timeout` (600 s) and then blame a server "full, or restarting"."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from agentrl.envs.client import EnvUnreachableError, EpisodeClient, ws_url
from agentrl.envs.connection import OPEN_TIMEOUT_S


async def test_a_frozen_server_is_unreachable_after_connect_timeout_not_reset_timeout() -> None:
    with socket.socket() as frozen:  # listens, never accepts: what a SIGSTOPped server looks like from outside
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(64)
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        t0 = time.monotonic()
        async with asyncio.timeout(300):  # a hang net only: with the bug the reset waits out reset_timeout
            with pytest.raises(EnvUnreachableError) as ei:
                async with EpisodeClient(url, reset_timeout=600, connect_timeout=1) as env:
                    await env.reset("eval", 0)
        took = time.monotonic() - t0
    message = str(ei.value)
    assert ei.value.url == ws_url(url) and "did not answer the WebSocket handshake" in message, message
    assert "full, or restarting" not in message
    # One silent handshake (OPEN_TIMEOUT_S) then connect_timeout's window, nowhere near reset_timeout's 600 s.
    assert took >= OPEN_TIMEOUT_S * 0.9 and took < 300, took
