"""`env=mix` under `sandbox=docker`: each episode's container rebuilds the mix from its `spec()` (the groups already
resolved, so no OmegaConf in the minimal image) and plays the row's own bundle there.

Needs a Docker daemon (`bash .ci/setup_docker.sh`); skipped with a reason when none answers, unless
AGENTRL_REQUIRE_DOCKER=1 (then that fails).
"""

from __future__ import annotations

import json

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.client import EpisodeClient
from agentrl.envs.server import build_app, serve_in_background

pytestmark = pytest.mark.docker


async def test_a_mix_is_played_in_docker_containers_by_each_rows_bundle(docker_client):
    mix = load_bundle("mix", bundles={"compact": {"env": "gridsim", "weight": 0.5, "prompt_style": "compact"},
                                      "full": {"env": "gridsim", "weight": 0.5}}, train_size=10)
    assert [mix.task_info("eval", i).extra["bundle"] for i in range(2)] == ["compact", "full"]
    rewards = {}
    with serve_in_background(build_app(mix, sandbox="docker", max_concurrent_envs=2)) as url:
        for index in (0, 1):
            call = mix.demonstration("eval", index, "each")[2]["tool_calls"][0]["function"]
            async with EpisodeClient(url, reset_timeout=300) as env:
                prompt, _, _ = await env.reset("eval", index)
                assert prompt == mix.episode("eval", index).first_turn().prompt  # the group's own prompt style
                right = (await env.call(call["name"], json.loads(call["arguments"]))).reward
            rewards[mix.task_info("eval", index).extra["bundle"]] = right
    assert rewards == {"compact": 1.0, "full": 1.0}
