"""The local sandbox: worker threads for episodes that may block, the event loop for declared-inline ones."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.sandbox.local import LocalSandbox
from agentrl.envs.server.echo import EchoBundle


class RecordingEcho(EchoBundle):
    """Echo tasks whose tool calls record the thread they ran on."""

    def __init__(self, inline: bool) -> None:
        super().__init__(inline=inline)
        self.threads: list[int] = []

    def episode(self, split, index):
        ep = super().episode(split, index)
        call = ep.call_tool

        def recorded(name, arguments):
            self.threads.append(threading.get_ident())
            return call(name, arguments)

        ep.call_tool = recorded
        return ep


@pytest.mark.parametrize("inline", [True, False])
async def test_calls_run_inline_only_when_the_bundle_says_so(inline: bool):
    bundle = RecordingEcho(inline)
    sandbox = LocalSandbox(bundle, workers=2)
    await sandbox.start()
    handle = await sandbox.deploy("train", 0)
    result = await handle.call_tool("echo", {"text": "hi"})
    assert "hi" in result.text
    loop_thread = threading.get_ident()
    assert (bundle.threads == [loop_thread]) is inline
    await handle.close()
    await sandbox.shutdown()
    assert sandbox.live == 0


async def test_a_blocking_episode_does_not_stall_another():
    sandbox = LocalSandbox(EchoBundle(), workers=4)  # echo has a blocking `sleep` tool: threads by default
    await sandbox.start()
    slow, fast = await sandbox.deploy("train", 0), await sandbox.deploy("train", 1)
    sleeping = asyncio.ensure_future(slow.call_tool("sleep", {"seconds": 1.0}))
    await asyncio.sleep(0.05)
    started = asyncio.get_running_loop().time()
    await fast.call_tool("echo", {"text": "x"})
    assert asyncio.get_running_loop().time() - started < 0.5
    assert not sleeping.done()
    await sleeping
    await sandbox.shutdown()


def test_shipped_bundles_declare_inline_episodes():
    assert load_bundle("gridsim").inline_episodes and load_bundle("arith").inline_episodes
    assert not EchoBundle().inline_episodes
