"""env=openenv plays OpenEnv's own example environments: the MCP one (`echo_env`, an `MCPEnvironment`) and a plain
one (`grid_world_env`, a typed action), each served by OpenEnv's own `create_app` from its folder's openenv.yaml
(`env.serve=<folder>`), and both through a short GRPO run of the real CLI. The examples are upstream's code,
unmodified (tests/envs/openenv_examples/SOURCE.md)."""

from __future__ import annotations

import json
import re
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.openenv_remote.local_app import local_app, read_manifest
from agentrl.envs.bundles.openenv_remote.teacher import play_demonstration
from agentrl.play.eval_subset import spread
from agentrl.testing.cli import run_agentrl
from agentrl.uvicorn_servers import serve_in_background
from tests.envs.openenv_examples.grid_world_teacher import to_goal

EXAMPLES = Path(__file__).resolve().parent / "openenv_examples"
ECHO, GRID = EXAMPLES / "echo_env", EXAMPLES / "grid_world_env"


def test_the_examples_run_on_openenv_0_10() -> None:
    assert Version(version("openenv")) >= Version("0.10")  # the server these tests play is 0.10's create_app
    routes = {getattr(r, "path", None) for r in local_app(str(ECHO)).app.routes}
    assert {"/ws", "/mcp", "/schema", "/metadata"} <= routes


def test_the_mcp_example_is_served_from_its_manifest_and_its_tools_are_played() -> None:
    bundle = load_bundle("openenv", serve=str(ECHO), prompt="Echo hello.", train_size=2, eval_size=1)
    assert bundle.mode == "tools"
    names = {t["function"]["name"] for t in bundle.tools}
    assert names == {"echo_message", "echo_with_length"}  # discovered over the server's MCP tools
    assert bundle.env_name == "echo_env"  # the manifest's name, not the class's
    assert bundle.task_info("eval", 0).task_id == "echo_env-eval-0"
    assert bundle.data_options()["url"] == f"serve:echo_env@{ECHO}"  # the warm start's key: the env, not a port
    episode = bundle.episode("train", 0)
    try:
        turn = episode.first_turn()
        assert turn.prompt == "Echo hello." and {t["function"]["name"] for t in turn.tools} == names
        said = episode.call_tool("echo_message", {"message": "hello"})
        assert (said.text, said.is_error, said.done) == ("hello", False, False)
        measured = episode.call_tool("echo_with_length", {"message": "hello"})
        assert json.loads(measured.text) == {"message": "hello", "length": 5}
        wrong = episode.call_tool("echo_louder", {"message": "hello"})
        assert wrong.is_error and "echo_louder" in wrong.text  # the MCP server's own "unknown tool" answer
        episode.end_turn("")
        assert episode.scores() == {"reward": 0.0}  # the echo env never rewards
    finally:
        episode.close()


def test_the_plain_example_takes_its_typed_action_as_one_tool_and_pays_at_the_goal() -> None:
    bundle = load_bundle("openenv", serve=str(GRID), train_size=2, eval_size=1,
                         teacher="tests.envs.openenv_examples.grid_world_teacher:to_goal")
    assert bundle.mode == "actions" and bundle.env_name == "grid_world"
    (tool,) = bundle.tools
    params = tool["function"]["parameters"]
    assert tool["function"]["name"] == "act" and params["required"] == ["action"]
    assert params["$defs"]["MoveAction"]["enum"] == ["UP", "DOWN", "LEFT", "RIGHT"]  # from its /schema
    # The teacher's play is real: eight moves on the server, the last one at the goal ends it with 1.0.
    transcript, reward = play_demonstration(bundle.episode("train", 0), to_goal, "train/0")
    moves = [json.loads(m["tool_calls"][0]["function"]["arguments"])["action"]
             for m in transcript if m["role"] == "assistant"]
    assert moves == ["DOWN"] * 4 + ["RIGHT"] * 4 and reward == 1.0
    assert json.loads(transcript[-2]["content"]) == {"message": "Keep going...", "x": 4, "y": 3}
    # A move the action's schema refuses is the agent's error, not the env's; the episode goes on.
    episode = bundle.episode("eval", 0)
    try:
        episode.first_turn()
        refused = episode.call_tool("act", {"action": "SIDEWAYS"})
        assert refused.is_error and refused.text.startswith("invalid action") and not refused.done
        assert episode.call_tool("act", {"action": "UP"}).text == json.dumps(
            {"message": "Keep going...", "x": 0, "y": 0}, sort_keys=True)  # clamped at the wall
        episode.end_turn("")
        assert episode.scores() == {"reward": -0.1}  # stopped short of the goal: the env's last reward
    finally:
        episode.close()


def test_an_environment_folder_is_named_and_checked(tmp_path: Path) -> None:
    def folder(name: str, manifest: str | None, **files: str) -> str:
        path = tmp_path / name
        path.mkdir()
        if manifest is not None:
            (path / "openenv.yaml").write_text(manifest)
        for file, text in files.items():
            (path / file).write_text(text)
        return str(path)

    cases = [(folder("bare", None), "has no openenv.yaml"),
             (str(tmp_path / "missing" / "openenv.yaml"), "does not exist"),
             (folder("noapp", "spec_version: 1\nname: noapp\n"), "has no `app: module:attribute`"),
             (folder("listy", "- app\n"), "must be a YAML mapping"),
             (folder("broken", "app: [server.app\n"), "not valid YAML"),
             (folder("noattr", "app: flat:nothing\n", **{"flat.py": "x = 1\n"}), "has no 'nothing'"),
             (folder("raises", "app: flat:app\n", **{"flat.py": "raise RuntimeError('no database')\n"}),
              "RuntimeError: no database"),
             (folder("agentrl", "app: plan:build_plan\n"), "is imported from")]  # a name already taken here
    for spec, says in cases:
        with pytest.raises(ValueError, match=re.escape(says)) as caught:
            load_bundle("openenv", serve=spec, train_size=1, eval_size=1)
        assert f"env.serve={spec}" in str(caught.value)
    assert read_manifest(ECHO / "openenv.yaml") == read_manifest(ECHO)  # the folder or its manifest


# An environment of our own, written as `openenv init` lays one out but in a folder whose name is not a Python
# package name (so its modules are imported from inside it), its app a factory rather than an app object.
COUNTER = '''
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class Add(Action):
    amount: int


class Total(Observation):
    total: int = 0


class CounterEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.total = 0

    def reset(self, seed=None, episode_id=None, **kw):
        self.total = seed or 0
        return Total(total=self.total)

    def step(self, action, timeout_s=None, **kw):
        self.total += action.amount
        return Total(total=self.total, done=self.total == 10, reward=1.0 if self.total == 10 else 0.0)

    @property
    def state(self):
        return State(step_count=0)


def make_app():
    return create_app(CounterEnv, Add, Total, max_concurrent_envs=4)
'''


def test_an_environment_folder_that_is_not_a_package_name_is_served_from_inside(tmp_path: Path) -> None:
    path = tmp_path / "my-counter"
    path.mkdir()
    (path / "openenv.yaml").write_text("spec_version: 1\nname: counter\napp: counter_server:make_app\n")
    (path / "counter_server.py").write_text(COUNTER)
    served = local_app(str(path))
    assert served.name == "counter" and served.key == f"serve:counter@{path.resolve()}"
    bundle = load_bundle("openenv", serve=str(path), train_size=2, eval_size=1)
    assert bundle.mode == "actions" and bundle.env_name == "counter"
    episode = bundle.episode("train", 1)  # reset with seed 1
    try:
        assert episode.first_turn().prompt == '{"total": 1}'
        assert episode.call_tool("act", {"amount": 4}).text == '{"total": 5}'
        done = episode.call_tool("act", {"amount": 5})
        assert done.done and episode.scores() == {"reward": 1.0}
    finally:
        episode.close()


class Recorder:
    """An ASGI wrapper that counts the WebSocket frames the example's server receives: by `type`, a step by its
    action's `type` too (`step:list_tools`, `step:call_tool`)."""

    def __init__(self, app: Any) -> None:
        self.app, self.frames, self.lock = app, {}, threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def counted() -> dict[str, Any]:
            message = await receive()
            if message.get("type") == "websocket.receive" and message.get("text"):
                frame = json.loads(message["text"])
                kind = frame.get("type")
                if kind == "step":
                    kind = f"step:{(frame.get('data') or {}).get('type')}"
                with self.lock:
                    self.frames[kind] = self.frames.get(kind, 0) + 1
            return message

        await self.app(scope, counted if scope["type"] == "websocket" else receive, send)


def _grpo(home: Path, *overrides: str) -> tuple[str, list[dict[str, Any]]]:
    """(console output, the final eval's per-task records) of a one-step GRPO run from the untrained tiny model."""
    done = run_agentrl(["+recipe=openenv_guess", "env.teacher=null", "trainer.warm_start.enabled=false",
                        "trainer.steps=1", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
                        "trainer.eval_limit=2", "agent.max_turns=2", "task_name=openenv_example", *overrides],
                       home, timeout=1200, check=False).process
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"final eval/grade\s+-?[\d.]+", out), out[-4000:]
    (evals,) = home.glob("outputs/runs/openenv_example/*/evals")
    last = max(evals.glob("eval-step-*.jsonl"), key=lambda p: int(re.search(r"(\d+)", p.stem).group(1)))
    return out, [json.loads(line) for line in last.read_text().splitlines() if line.strip()]


@pytest.mark.slow  # a one-step GRPO run of the tiny model: ~2 min on a loaded 2-core box
def test_a_grpo_run_plays_the_plain_example_served_from_its_folder(tmp_path: Path) -> None:
    out, records = _grpo(tmp_path / "home", f"env.serve={GRID}")
    # The manifest's name; the eval subset of 2 is spread over env.eval_size's 32 seeds (no eval_strata), not the first 2.
    assert [r["task_id"] for r in records] == [f"grid_world-eval-{i}" for i in spread(list(range(32)), 2)]
    for record in records:
        for sample in record["samples"]:
            # Every episode reset and ended on the real server (the untrained model's reply may be cut at
            # max_response_tokens without a tool call: flagged truncated, not scored)
            assert sample["failure"] in (None, "truncated")
            assert sample["score"] in (0.0, -0.1, 1.0)  # what the grid world pays: nothing yet, a move, the goal


@pytest.mark.slow  # a one-step GRPO run of the tiny model: ~2 min on a loaded 2-core box
def test_a_grpo_run_plays_the_mcp_example_on_its_own_server(tmp_path: Path) -> None:
    recorder = Recorder(local_app(str(ECHO)).app)
    with serve_in_background(recorder) as url:
        out, records = _grpo(tmp_path / "home", f"env.url={url}", "env.serve=null",
                             'env.prompt="Echo hello with echo_message."')
    # Every play was a session of the echo server: the plan's tool probe, the step's 4 plays, 2 + 2 eval tasks.
    assert recorder.frames.get("reset", 0) >= 1 + 4 + 2 + 2, recorder.frames
    assert recorder.frames.get("step:list_tools", 0) >= recorder.frames["reset"]  # each episode discovers the tools
    for record in records:
        assert record["prompt"].startswith("Echo hello with echo_message.")
        # Echo never pays; an untrained reply cut at max_response_tokens without a tool call is flagged truncated.
        assert all(s["failure"] in (None, "truncated") and s["score"] == 0.0 for s in record["samples"]), record
