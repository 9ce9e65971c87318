"""GridSim served by our server, played by openenv 0.10's own clients over real uvicorn."""

from __future__ import annotations

import json

import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from agentrl.envs.bundles import load_bundle
from agentrl.envs.client import EpisodeClient
from agentrl.envs.server import build_app, serve_in_background


@pytest.fixture(scope="module")
def gridsim():
    return load_bundle("gridsim")


@pytest.fixture(scope="module")
def url(gridsim):
    with serve_in_background(build_app(gridsim, max_concurrent_envs=4)) as base:
        yield base


@pytest.mark.parametrize("split,index", [("eval", 0), ("eval", 150), ("train", 7)])
def test_mcp_tool_client_scores_the_optimum_1(url, gridsim, split, index):
    optimal = gridsim.row(split, index)["optimal_schedule"]
    with MCPToolClient(base_url=url, message_timeout_s=60).sync() as env:
        r = env.reset(split=split, index=index)
        assert r.observation.metadata["task"]["id"] == gridsim.task_info(split, index).task_id
        assert "24" in r.observation.metadata["prompt"]
        tools = env.list_tools(use_cache=False)
        assert [t.name for t in tools] == ["submit_schedule", "end_turn"]
        assert tools[0].input_schema["required"] == ["schedule"]
        r = env.step(CallToolAction(tool_name="submit_schedule", arguments={"schedule": optimal}))
        assert r.done is True and r.reward == 1.0
        assert r.observation.metadata["scores"] == {"grade": 1.0}
        assert json.loads(r.observation.result["data"])["feasible"] is True


@pytest.mark.parametrize("schedule,reward", [("optimal", 1.0), ("idle", 0.2)])
def test_mcp_tool_client_call_tool_returns_the_scored_observation(url, gridsim, schedule, reward):
    """Production mode end to end: tools/call over HTTP /mcp on the session the client created there."""
    plan = gridsim.row("eval", 5)["optimal_schedule"] if schedule == "optimal" else [0] * 24
    with MCPToolClient(base_url=url, message_timeout_s=60).sync() as env:
        env.reset(split="eval", index=5)
        scored = env.call_tool("submit_schedule", schedule=plan)
        assert (scored["reward"], scored["done"], scored["metadata"]["scores"]) == (reward, True, {"grade": reward})


def test_generic_client_idling_scores_0_2(url):
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset(split="eval", index=0)
        r = env.step({"type": "call_tool", "tool_name": "submit_schedule", "arguments": {"schedule": [0] * 24}})
        assert (r.reward, r.done) == (0.2, True)
        assert r.observation["metadata"]["scores"] == {"grade": 0.2}


def test_all_split_and_feedback_then_end_turn(url, gridsim):
    n_train = gridsim.splits()["train"]
    n_all = sum(gridsim.splits().values())
    with GenericEnvClient(base_url=url).sync() as env:
        # `all` is every split in the bundle's order; its last task is the last task of the last split.
        last_split = list(gridsim.splits())[-1]
        r = env.reset(split="all", index=n_all - 1)
        assert r.observation["metadata"]["task"]["id"] == gridsim.task_info(last_split, gridsim.splits()[last_split] - 1).task_id
        # An infeasible schedule is feedback, not the end; ending the turn then scores 0.
        r = env.step({"type": "call_tool", "tool_name": "submit_schedule", "arguments": {"schedule": [-1] * 24}})
        assert not r.done and json.loads(r.observation["result"]["data"])["feasible"] is False
        r = env.step({"type": "call_tool", "tool_name": "end_turn", "arguments": {"response": "done"}})
        assert (r.reward, r.done) == (0.0, True)
        r = env.reset(split="all", index=n_all)
        assert r.done and "has no task" in r.observation["metadata"]["error"]
    assert n_train > 0


async def test_episode_client_plays_the_optimum(url, gridsim):
    optimal = gridsim.row("train", 3)["optimal_schedule"]
    async with EpisodeClient(url) as env:
        _, system, tools = await env.reset("train", 3)
        assert system and tools[0]["function"]["name"] == "submit_schedule"
        r = await env.call("submit_schedule", {"schedule": optimal})
        assert (r.done, r.reward, r.scores) == (True, 1.0, {"grade": 1.0})
