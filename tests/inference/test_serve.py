"""The project's tiny model behind a real socket: in-process SessionServer and the serve CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.sessions.server import start_session_server
from agentrl.testing.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TINY_NAME = "tiny-s0-h128-l4-v2048"  # conf/model/tiny.yaml's folder name for the defaults

pytestmark = pytest.mark.slow  # builds the tiny model once (tens of seconds on a busy CPU)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.testing.tiny_models import shared_tiny_model

    return Path(shared_tiny_model())  # read only (test_serve_cli copies it): built once per session


def test_in_process_server_with_tiny_model(tiny_model):
    engine = EmbeddedEngine(tiny_model)
    server = start_session_server(engine, port=0, default_max_tokens=6)
    try:
        sid = server.create_session()
        url = server.session_url(sid) + "/v1/chat/completions"
        tools = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]
        messages = [{"role": "user", "content": "go north"}]
        with httpx.Client(timeout=300) as client:
            for turn in range(2):
                r = client.post(url, json={"messages": messages, "tools": tools, "temperature": 0.9})
                assert r.status_code == 200, r.text
                reply = r.json()["choices"][0]["message"]
                calls = reply.get("tool_calls")  # a tool message must answer a call; else the result is the user's
                messages += [reply, {"role": "tool", "tool_call_id": calls[0]["id"], "content": f"moved {turn}"}
                             if calls else {"role": "user", "content": f"moved {turn}"}]
            remote = client.get(f"{server.base_url}/sessions/{sid}").json()
        sample = server.sample(sid, reward=0.5)
        assert remote["records"] == server.records(sid)
        assert sample.token_ids == remote["metadata"]["accumulated_token_ids"]
        tok = engine.tokenizer
        assert tok.decode(sample.token_ids[: sample.prompt_length]) == tok.apply_chat_template(
            messages[:1], tools=tools, tokenize=False, add_generation_prompt=True)
        second_prompt = remote["records"][1]["request"]["input_ids"]
        result = ("<tool_response>\nmoved 0\n</tool_response>" if messages[2]["role"] == "tool"
                  else "<|im_start|>user\nmoved 0")
        assert tok.decode(second_prompt).endswith(result + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert sum(sample.loss_mask) == sum(e - s for s, e in sample.turn_boundaries) > 0
        server.delete_session(sid)
        assert len(server.sessions) == 0
    finally:
        server.stop()
        engine.close()


def test_serve_cli(tiny_model, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(tiny_model, home / "outputs" / "models" / TINY_NAME)  # the folder ensure_tiny_model reuses
    port = free_port()
    env = dict(os.environ, AGENTRL_HOME=str(home))
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.inference.serve", "model=tiny", f"port={port}",
                             "default_max_tokens=4"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 400
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.5)
        sid = httpx.post(f"{base}/sessions").json()["session_id"]
        r = httpx.post(f"{base}/sessions/{sid}/v1/chat/completions", timeout=300,
                       json={"messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4
        assert len(httpx.get(f"{base}/sessions/{sid}").json()["records"]) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
