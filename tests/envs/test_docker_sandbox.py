"""The Docker sandbox against a real daemon: episodes in containers, deaths, leftovers, shutdown, warm pool.

Needs a Docker daemon (`bash .ci/setup_docker.sh`); skipped with a reason when none answers, unless
AGENTRL_REQUIRE_DOCKER=1 (then that fails).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentrl.config.sandbox import DockerSandboxConfig
from agentrl.envs.bundles import load_bundle
from agentrl.envs.sandbox.base import SandboxError
from agentrl.envs.sandbox.docker import DockerSandbox
from agentrl.envs.sandbox.docker_support import owner_alive, proc_start
from agentrl.envs.sandbox.image import DEFAULT_IMAGE

docker = pytest.importorskip("docker")

TEST_BUNDLE = '''
    import time
    from agentrl.envs.task import Bundle, Episode, TaskInfo, ToolResult, Turn

    class Ep(Episode):
        def __init__(self, index):
            self.info = TaskInfo(task_id=f"t{index}", split="train", index=index)
            self._done = False

        def first_turn(self):
            return Turn(prompt="p", system_prompt="s")

        def call_tool(self, name, arguments):
            if name == "sleep":
                time.sleep(float(arguments["seconds"]))
            if name == "boom":
                raise RuntimeError("kaboom")
            if name == "eat":
                hog = [bytearray(1 << 20) for _ in range(int(arguments["mb"]))]
                return ToolResult(str(len(hog)))
            return ToolResult(f"ok {name}")

        def end_turn(self, response):
            self._done = True
            return None

        @property
        def done(self):
            return self._done

        def scores(self):
            return {"grade": 1.0} if self._done else {}

    class TestBundle(Bundle):
        name, version = "testbundle", "1"

        def splits(self):
            return {"train": 4}

        def task_info(self, split, index):
            return TaskInfo(task_id=f"t{index}", split=split, index=index)

        def episode(self, split, index):
            if not 0 <= index < 4:
                raise IndexError(f"no task {index}")
            return Ep(index)

        def spec(self):
            return {"bundle": "testbundle"}

    def load(bundle, **options):
        return TestBundle()
'''


@pytest.fixture(scope="module")
def client(docker_client):
    return docker_client


@pytest.fixture(scope="module")
def gridsim():
    return load_bundle("gridsim")


@pytest.fixture
async def sandbox(client, gridsim):
    sb = DockerSandbox(gridsim.spec())
    await sb.start()
    yield sb
    await sb.shutdown()


def ours(client, sb: DockerSandbox) -> list:
    return client.containers.list(all=True, filters={"label": f"agentrl.instance={sb.instance_id}"},
                                  ignore_removed=True)


async def play_optimal(sb: DockerSandbox, gridsim, index: int) -> float:
    h = await sb.deploy("eval", index)
    try:
        turn = await h.first_turn()
        assert [t["function"]["name"] for t in turn.tools] == ["submit_schedule"]
        result = await h.call_tool("submit_schedule", {"schedule": gridsim.row("eval", index)["optimal_schedule"]})
        assert result.done and not result.is_error
        assert await h.done()
        return (await h.scores())["grade"]
    finally:
        await h.close()


@pytest.mark.docker
async def test_gridsim_episode_plays_to_its_reward_in_a_locked_down_container(client, sandbox, gridsim):
    h = await sandbox.deploy("eval", 3)
    local = gridsim.episode("eval", 3)
    assert h.task_id == local.info.task_id
    assert (await h.first_turn()) == local.first_turn()
    (c,) = ours(client, sandbox)
    assert c.labels["agentrl.sandbox"] == "1" and c.labels["agentrl.pid"] == str(os.getpid())
    assert c.labels["agentrl.host"] == socket.gethostname()
    cfg = c.attrs["HostConfig"]
    assert cfg["NetworkMode"] == "none" and cfg["ReadonlyRootfs"] and cfg["Memory"] == 512 << 20
    assert all(m["RW"] is False for m in c.attrs["Mounts"])
    bad = {"schedule": "nonsense"}
    assert await h.call_tool("submit_schedule", bad) == local.call_tool("submit_schedule", bad)
    assert not await h.done()
    schedule = gridsim.row("eval", 3)["optimal_schedule"]
    assert await h.call_tool("submit_schedule", {"schedule": schedule}) == local.call_tool(
        "submit_schedule", {"schedule": schedule})
    assert await h.done() and await h.scores() == {"grade": 1.0}
    await h.close()
    await h.close()  # idempotent
    assert ours(client, sandbox) == []
    with pytest.raises(SandboxError, match="closed"):
        await h.done()


@pytest.mark.docker
async def test_bundle_folder_outside_the_package_is_mounted(client, gridsim, tmp_path):
    folder = tmp_path / "my gridsim"
    shutil.copytree(gridsim.folder, folder)
    sb = DockerSandbox({"bundle": str(folder), "prompt_style": "full"}, name="odd id/with: chars")
    await sb.start()
    try:
        assert await play_optimal(sb, gridsim, 0) == 1.0
    finally:
        await sb.shutdown()


@pytest.mark.docker
async def test_killed_container_flags_its_episode_and_the_sandbox_keeps_working(client, sandbox, gridsim):
    victim, bystander = await sandbox.deploy("eval", 0), await sandbox.deploy("eval", 1)
    await victim.first_turn()
    await asyncio.to_thread(client.containers.get(victim.container_name).kill)
    with pytest.raises(SandboxError, match=r"the episode's container died: exit code 137, killed"):
        await victim.call_tool("submit_schedule", {"schedule": [0] * 24})
    with pytest.raises(SandboxError, match="container died"):
        await victim.scores()
    await victim.close()  # never raises
    assert (await bystander.first_turn()).prompt
    await bystander.close()
    assert await play_optimal(sandbox, gridsim, 2) == 1.0
    for _ in range(50):  # the dead container is removed in the background
        if not ours(client, sandbox):
            break
        await asyncio.sleep(0.1)
    assert ours(client, sandbox) == []


@pytest.mark.docker
async def test_a_cancelled_deploy_leaves_no_container(client, sandbox):
    task = asyncio.create_task(sandbox.deploy("eval", 0))
    await asyncio.sleep(0.05)  # the container is being created in a worker thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        await asyncio.sleep(0.1)
        if not ours(client, sandbox):
            break
    assert ours(client, sandbox) == [] and sandbox.live_containers() == []


@pytest.mark.docker
async def test_errors_inside_the_container(client, tmp_path):
    (tmp_path / "testbundle.py").write_text(textwrap.dedent(TEST_BUNDLE))
    sb = DockerSandbox({"bundle": "testbundle"}, loader=f"{tmp_path}/testbundle.py:load", call_timeout=1.5,
                       memory="64m")
    await sb.start()
    try:
        with pytest.raises(SandboxError, match="IndexError: no task 9"):
            await sb.deploy("train", 9)
        h = await sb.deploy("train", 1)
        with pytest.raises(SandboxError, match="raised in its container: RuntimeError: kaboom"):
            await h.call_tool("boom", {})
        assert (await h.call_tool("x", {})).text == "ok x"  # a raising episode leaves its container alive
        with pytest.raises(SandboxError, match=r"container died: no answer to 'call_tool' within 1.5s \(killed\)"):
            await h.call_tool("sleep", {"seconds": 30})
        await h.close()
        h = await sb.deploy("train", 0)
        with pytest.raises(TimeoutError):  # the server's own tool timeout cancels the call
            async with asyncio.timeout(0.3):
                await h.call_tool("sleep", {"seconds": 1})
        await asyncio.sleep(1)  # the late answer must not be read as the next call's
        with pytest.raises(SandboxError, match="the call 'call_tool' was cancelled before it answered"):
            await h.done()
        await h.close()
        h = await sb.deploy("train", 2)
        with pytest.raises(SandboxError, match="container died: exit code 137, out of memory"):
            await h.call_tool("eat", {"mb": 400})
        await h.close()
        h = await sb.deploy("train", 3)
        assert await h.end_turn("bye") is None and await h.scores() == {"grade": 1.0}
        await h.close()
    finally:
        await sb.shutdown()
    assert ours(client, sb) == []


@pytest.mark.docker
async def test_bundle_that_fails_to_load_fails_the_deploy_clearly(client):
    sb = DockerSandbox({"bundle": "gridsim", "no_such_option": 1})
    await sb.start()
    try:
        with pytest.raises(SandboxError, match="bundle failed to load.*no_such_option"):
            await sb.deploy("eval", 0)
        assert ours(client, sb) == []
    finally:
        await sb.shutdown()
    with pytest.raises(SandboxError, match="none of the 1 warm containers"):
        await DockerSandbox({"bundle": "gridsim", "no_such_option": 1}, warm_pool=1).start()


@pytest.mark.docker
@pytest.mark.slow
async def test_32_concurrent_episodes_finish(client, sandbox, gridsim):
    grades = await asyncio.gather(*(play_optimal(sandbox, gridsim, i) for i in range(32)))
    assert grades == [1.0] * 32
    assert ours(client, sandbox) == []


@pytest.mark.docker
async def test_start_removes_only_containers_of_dead_instances(client, gridsim):
    finished = subprocess.Popen(["true"])
    finished.wait()
    me, host = os.getpid(), socket.gethostname()
    base = {"agentrl.sandbox": "1", "agentrl.host": host}
    made = {
        "dead": {**base, "agentrl.instance": "dead-1", "agentrl.pid": str(finished.pid)},
        "reused-pid": {**base, "agentrl.instance": "dead-2", "agentrl.pid": str(me), "agentrl.pid_start": "1"},
        "live": {**base, "agentrl.instance": "live-1", "agentrl.pid": str(me),
                 "agentrl.pid_start": proc_start(me)},
        "other-host": {**base, "agentrl.instance": "far-1", "agentrl.pid": str(finished.pid),
                       "agentrl.host": host + "-elsewhere"},
    }
    ids = {k: client.containers.create(DEFAULT_IMAGE, ["python3", "-c", "pass"], labels=v, network_mode="none").id
           for k, v in made.items()}
    try:
        sb = DockerSandbox(gridsim.spec())
        await sb.start()
        await sb.shutdown()
        left = {c.id for c in client.containers.list(all=True, filters={"label": "agentrl.sandbox=1"})}
        assert ids["dead"] not in left and ids["reused-pid"] not in left
        assert ids["live"] in left and ids["other-host"] in left
    finally:
        for cid in ids.values():
            try:
                client.api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass


@pytest.mark.docker
async def test_containers_of_a_hard_killed_server_are_removed_by_the_next_start(client, gridsim):
    script = textwrap.dedent("""
        import asyncio, sys
        from agentrl.envs.sandbox.docker import DockerSandbox
        async def main():
            sb = DockerSandbox({"bundle": "gridsim"}, warm_pool=1)
            await sb.start()
            h = await sb.deploy("eval", 0)
            while len(sb.live_containers()) < 2:  # the pool refills in the background
                await asyncio.sleep(0.05)
            print(sb.instance_id, flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    victim = "none yet"
    try:
        victim = proc.stdout.readline().strip()
        assert victim.startswith(f"sandbox-{proc.pid}-"), victim
        left = client.containers.list(filters={"label": f"agentrl.instance={victim}"}, ignore_removed=True)
        assert len(left) == 2  # one playing, one warm
        proc.kill()  # SIGKILL: no shutdown, no atexit
        proc.wait()
        # Their agents see the socket close and exit; the stopped containers stay until someone removes them.
        assert len(client.containers.list(all=True, filters={"label": f"agentrl.instance={victim}"},
                                          ignore_removed=True)) == 2
        sb = DockerSandbox(gridsim.spec())
        await sb.start()
        await sb.shutdown()
        assert client.containers.list(all=True, filters={"label": f"agentrl.instance={victim}"}) == []
    finally:
        proc.kill()
        for c in client.containers.list(all=True, filters={"label": f"agentrl.instance={victim}"}):
            c.remove(force=True)


@pytest.mark.docker
async def test_warm_pool_serves_deploys_and_refills_and_shutdown_removes_everything(client, gridsim):
    sb = DockerSandbox(gridsim.spec(), warm_pool=2)
    await sb.start()
    try:
        warm = set(sb.live_containers())
        assert len(warm) == 2 and len(ours(client, sb)) == 2
        t = time.perf_counter()
        h1 = await sb.deploy("eval", 0)
        warm_deploy = time.perf_counter() - t
        assert h1.container_name in warm
        assert warm_deploy < 0.2, f"a warm deploy took {warm_deploy:.3f}s"
        _h2, h3 = await sb.deploy("eval", 1), await sb.deploy("eval", 2)
        for _ in range(100):  # the pool refills in the background
            if len(sb.live_containers()) == 5:
                break
            await asyncio.sleep(0.1)
        assert len(sb.live_containers()) == 5  # 3 playing, 2 warm
        assert (await h3.first_turn()).prompt and (await h1.first_turn()).prompt
    finally:
        await sb.shutdown()  # h1..h3 left open on purpose
    assert ours(client, sb) == []
    with pytest.raises(SandboxError, match="shut down"):
        await h3.call_tool("submit_schedule", {"schedule": [0] * 24})
    await h3.close()  # after shutdown: still never raises
    with pytest.raises(SandboxError, match="not running"):
        await sb.deploy("eval", 0)


def test_owner_alive_reads_labels():
    me, host = str(os.getpid()), socket.gethostname()
    assert owner_alive({"agentrl.host": host, "agentrl.pid": me, "agentrl.pid_start": proc_start(os.getpid())})
    assert not owner_alive({"agentrl.host": host, "agentrl.pid": me, "agentrl.pid_start": "0"})
    assert not owner_alive({"agentrl.host": host, "agentrl.pid": str(2**22 + 7)})
    assert owner_alive({"agentrl.host": "elsewhere", "agentrl.pid": str(2**22 + 7)})


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="'bundle' string"):
        DockerSandbox({"name": "gridsim"})
    with pytest.raises(ValueError, match="JSON-safe"):
        DockerSandbox({"bundle": "gridsim", "x": object()})
    with pytest.raises(ValueError, match="warm_pool"):
        DockerSandbox({"bundle": "gridsim"}, warm_pool=-1)
    with pytest.raises(ValueError, match="docker_timeout"):
        DockerSandbox({"bundle": "gridsim"}, docker_timeout=0)
    assert DockerSandbox({"bundle": "gridsim"}).docker_timeout == DockerSandboxConfig.docker_timeout == 30.0
    with pytest.raises(ValueError, match="loader file"):
        DockerSandbox({"bundle": "gridsim"}, loader="relative.py:load")
    assert Path(DockerSandbox({"bundle": "gridsim"}).bundle_spec["bundle"]) == Path("gridsim")
