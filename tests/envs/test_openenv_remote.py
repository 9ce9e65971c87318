"""`env=openenv` against real OpenEnv servers (the installed `openenv` package's own app, not our server).

Two remote envs: `GuessEnv`, the documented example (`agentrl.envs.bundles.openenv_remote.example`: an OpenEnv
`MCPEnvironment` with one FastMCP tool, find a hidden number: a multi-step episode, reward 1 when found), and
`CounterEnv`, defined here, a typed-action env (`CountAction`) whose step
raises on a negative increment (a remote failure). Our agent plays them through our env server serving the
`openenv` bundle, with the scripted chat endpoint as the model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

from agentrl.agents.tool_calling import run
from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.openenv_remote.example import GuessEnv
from agentrl.envs.server import build_app, serve_in_background
from agentrl.rows import write_rows
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.testing.ports import free_port


class NoToolsEnv(GuessEnv):
    """An MCP env whose server has no tools at all."""

    def __init__(self) -> None:
        MCPEnvironment.__init__(self, FastMCP("empty"))
        self.secret, self.won, self.steps = 1, False, 0


class CountAction(Action):
    """Add `increment` to the counter; reach the target in as few steps as you can."""

    increment: int


class CountObservation(Observation):
    total: int = 0
    target: int = 0


class CounterEnv(Environment):
    """A typed-action env (no MCP): reward 1/steps once the total reaches the target; a negative step raises."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.total, self.target, self.steps = 0, 5, 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> CountObservation:
        self.total, self.target, self.steps = 0, 3 + (seed or 0) % 4, 0
        return CountObservation(total=0, target=self.target)

    def step(self, action: CountAction, timeout_s: float | None = None, **kw: Any) -> CountObservation:
        if action.increment < 0:
            raise RuntimeError("the counter cannot go down")
        self.total += action.increment
        self.steps += 1
        done = self.total >= self.target
        return CountObservation(total=self.total, target=self.target, done=done,
                                reward=(1.0 / self.steps if self.total == self.target else 0.0) if done else None)

    @property
    def state(self) -> State:
        return State(step_count=self.steps)

    def close(self) -> None:
        pass


def open_session(chat_url: str) -> str:
    sid = httpx.post(f"{chat_url}/sessions", trust_env=False).json()["session_id"]
    return f"{chat_url}/sessions/{sid}"


def served_remote(factory: Any, action: type, observation: type) -> Any:
    return serve_in_background(create_app(factory, action, observation, max_concurrent_envs=4))


@pytest.fixture(scope="module")
def guess_url() -> Iterator[str]:
    with served_remote(GuessEnv, CallToolAction, CallToolObservation) as url:
        yield url


@pytest.fixture(scope="module")
def counter_url() -> Iterator[str]:
    with served_remote(CounterEnv, CountAction, CountObservation) as url:
        yield url


async def play(bundle: Any, script: list[Reply], split: str = "eval", index: int = 0) -> tuple[dict, ScriptedChat]:
    chat = ScriptedChat(script)
    with serve_in_background(build_app(bundle, max_concurrent_envs=4, tool_timeout=20)) as env_url, \
            chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {"max_tokens": 64},
                        {"url": env_url, "split": split, "index": index, "max_turns": 8})
    return out, chat


async def test_mcp_tools_are_discovered_and_a_multi_step_episode_earns_the_envs_reward(guess_url):
    bundle = load_bundle("openenv", url=guess_url, train_size=4, eval_size=2)
    assert bundle.mode == "tools" and [t["function"]["name"] for t in bundle.tools] == ["guess"]
    assert bundle.tools[0]["function"]["parameters"]["properties"] == {"number": {"type": "integer"}}
    assert bundle.splits() == {"train": 4, "eval": 2}
    # eval task 0 resets with seed 4 (the train seeds are 0..3): the hidden number is 5.
    script = [Reply(tool_calls=[tool_call("guess", {"number": n})]) for n in (3, 7, 5)]
    out, chat = await play(bundle, script)
    assert out["reward"] == 1.0 and "agentenv_failure" not in out
    assert out["agentenv_tool_calls"] == 3 and out["agentenv_scores"] == {"reward": 1.0}
    first = chat.requests[0]
    assert {t["function"]["name"] for t in first["tools"]} == {"guess", "end_turn"}
    assert "Find the hidden number between 1 and 8" in first["messages"][1]["content"]
    answers = [m["content"] for m in chat.requests[-1]["messages"] if m["role"] == "tool"]
    assert answers == ["higher", "lower"]


async def test_ending_the_turn_early_scores_what_the_env_gave(guess_url):
    bundle = load_bundle("openenv", url=guess_url, train_size=2, eval_size=1)
    out, _ = await play(bundle, [Reply(tool_calls=[tool_call("guess", {"number": 1})]), Reply(content="I give up")])
    assert out["reward"] == 0.0 and out["agentenv_scores"] == {"reward": 0.0} and "agentenv_failure" not in out


async def test_a_typed_action_env_is_one_step_tool_and_its_failure_is_flagged(counter_url):
    bundle = load_bundle("openenv", url=counter_url, train_size=3, eval_size=2, seed=10)
    assert bundle.mode == "actions"
    [tool] = bundle.tools
    assert tool["function"]["name"] == "act" and set(tool["function"]["parameters"]["properties"]) == {"increment"}
    # eval 0 resets with seed 13: target 3 + 13 % 4 = 4, reached in two steps -> reward 1/2.
    out, chat = await play(bundle, [Reply(tool_calls=[tool_call("act", {"increment": 2})])] * 2)
    assert out["reward"] == 0.5 and "agentenv_failure" not in out
    assert json.loads(chat.requests[0]["messages"][1]["content"]) == {"target": 4, "total": 0}
    # The agent's malformed action is answered, then the env raises: the rollout is flagged, not rewarded.
    out, chat = await play(bundle, [Reply(tool_calls=[tool_call("act", {"increment": "many"})]),
                                    Reply(tool_calls=[tool_call("act", {"increment": -1})])])
    assert "invalid action" in [m for m in chat.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert out["agentenv_failure"] == "env_error"
    assert out["reward"] == 0.0


def test_rows_for_miles_are_written_from_the_remote_env(guess_url, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(r) for r in [
        {"split": "train", "prompt": "Guess well.", "reset": {"seed": 1}, "task_id": "g1"},
        {"split": "train", "reset": {"seed": 2}},
        {"split": "eval", "reset": {"seed": 9}, "system_prompt": "Be quick."},
    ]) + "\n")
    bundle = load_bundle("openenv", url=guess_url, tasks=str(tasks))
    with serve_in_background(build_app(bundle, max_concurrent_envs=2)) as env_url:
        paths = write_rows(env_url, tmp_path / "rows", max_turns=6)
    rows = {s: [json.loads(line) for line in p.read_text().splitlines()] for s, p in paths.items()}
    assert {s: len(r) for s, r in rows.items()} == {"all": 3, "train": 2, "eval": 1}
    first = rows["train"][0]
    assert first["metadata"]["task_id"] == "g1" and first["messages"][1]["content"].startswith("Guess well.")
    assert [t["function"]["name"] for t in first["metadata"]["tools"]] == ["guess", "end_turn"]
    assert rows["eval"][0]["messages"][0]["content"] == "Be quick."


def test_bad_input_fails_at_plan_time_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match="env.url is not set"):
        load_bundle("openenv")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"env.url=http://127.0.0.1:\d+ is unreachable"):
        load_bundle("openenv", url=f"http://127.0.0.1:{free_port()}", connect_timeout=5)
    assert time.monotonic() - start < 60  # a hang net, not a speed check
    with served_remote(NoToolsEnv, CallToolAction, CallToolObservation) as url, \
            pytest.raises(ValueError, match="the env offers no tools.*env.tools"):
        load_bundle("openenv", url=url)


def test_named_tools_must_exist(guess_url):
    with pytest.raises(ValueError, match=r"env.tools names \['shout'\]"):
        load_bundle("openenv", url=guess_url, tools=["guess", "shout"])
