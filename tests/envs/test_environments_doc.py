"""docs/environments.md runs as written: every ```bash block, line by line (a line ending in `&` is a server
started in the background and waited for), in a fresh folder, with the example ports swapped for free ones. The
one line that needs the network, cloning OpenEnv, copies instead the examples the tests vendor from it (the same
files, tests/envs/openenv_examples/SOURCE.md) to where the clone would put them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.testing.ports import free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"  # the checkout's, wherever pytest runs
BLOCK = re.compile(r"^( *)```bash\n(.*?)^\1```", re.S | re.M)
PORTS = ("8010", "8200")  # the example ports the doc's commands use
CLONE = "git clone --depth 1 https://github.com/huggingface/OpenEnv"
EXAMPLES = Path(__file__).resolve().parent / "openenv_examples"


def blocks() -> list[list[str]]:
    return [[line.strip() for line in body.splitlines() if line.strip()]
            for _, body in BLOCK.findall(DOC.read_text())]


def wait_for(port: str, proc: subprocess.Popen, deadline_s: float = 300) -> None:
    """Until the background server at `port` answers /health (a hang net, not a speed check)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"the background server exited: {proc.stderr.read() if proc.stderr else ''}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise AssertionError(f"nothing answered on port {port}")


def test_the_doc_has_the_four_routes_the_rows_and_the_mix():
    commands = [" ".join(b) for b in blocks()]
    assert len(commands) == 7
    for i, needle in enumerate(("agentrl env=openenv", "agentrl.rows", "env.serve=OpenEnv/envs/", "env=reasoning_gym",
                                "env=textarena", "agentrl.envs new", "env=mix")):
        assert needle in commands[i], needle


@pytest.mark.slow
@pytest.mark.parametrize("index", range(7))
def test_each_example_runs(index: int, tmp_path: Path):
    ports = {p: str(free_port()) for p in PORTS}
    env = {**os.environ, "AGENTRL_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    servers: list[subprocess.Popen] = []
    # The rows example needs the OpenEnv server of the first one.
    setup = blocks()[0][:1] if index == 1 else []
    try:
        for line in setup + blocks()[index]:
            for old, new in ports.items():
                line = line.replace(old, new)
            if line == CLONE:
                for example in ("echo_env", "grid_world_env"):
                    shutil.copytree(EXAMPLES / example, tmp_path / "OpenEnv" / "envs" / example)
                continue
            if line.endswith("&"):
                proc = subprocess.Popen(["bash", "-c", line.rstrip("& ")], cwd=tmp_path, env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                servers.append(proc)
                wait_for(re.findall(r"(?:port[= ]|--port )(\d+)", line)[0], proc)
                continue
            done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=1200)
            assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            if "dry_run=true" in line:
                assert "dry run: composed, validated and instantiated" in done.stdout
    finally:
        for proc in servers:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    if index == 1:
        assert {p.name for p in (tmp_path / "rows").iterdir()} == {"all.jsonl", "train.jsonl", "eval.jsonl"}
