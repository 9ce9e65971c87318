"""Every agent pattern end to end against the embedded engine with the tiny model: whatever it answers,
every rollout ends with a reward or a flag, and every model turn was recorded by the session server."""

from __future__ import annotations

import math

import pytest

from agentrl.agents.adversarial import AdversarialAgent
from agentrl.agents.base import HttpSessionPool, multi_agent_metrics
from agentrl.agents.co_evolution import CoEvolutionAgent
from agentrl.agents.thinker_verifier import ThinkerVerifierAgent
from agentrl.agents.tool_calling import ToolCallingAgent
from agentrl.rewards import Asymmetric, EnvScore
from agentrl.testing.plays import rewarded

pytestmark = pytest.mark.slow

KNOWN_FLAGS = {"over_budget", "truncated", "max_turns", "no_reward", "model_error"}


@pytest.fixture(scope="module")
def session_server(tmp_path_factory):
    import torch

    from agentrl.inference.engines.embedded.engine import EmbeddedEngine
    from agentrl.inference.sessions.server import start_session_server
    from agentrl.testing.tiny_models import shared_tiny_model

    torch.set_num_threads(1)
    engine = EmbeddedEngine(shared_tiny_model())  # read only: built once per session
    server = start_session_server(engine, default_max_tokens=24)
    yield server
    server.stop()
    engine.close()


def row(url: str, split: str, index: int) -> dict:
    """A row without messages or tools: the agent takes both from the env's reset."""
    return {"messages": None, "metadata": {"url": url, "split": split, "index": index}}


def check(outputs, server) -> None:
    assert outputs
    for o in outputs:
        assert isinstance(o.reward, float) and math.isfinite(o.reward)
        failure = o.failure
        assert failure is None or failure in KNOWN_FLAGS, o.error
        if failure:
            assert o.reward == 0.0
        if o.turns:
            sid = o.base_url.rsplit("/", 1)[1]
            assert len(server.records(sid)) == o.turns


@pytest.mark.parametrize("agent, bundle, reward_fn", [
    (ToolCallingAgent(max_turns=2, max_response_tokens=24, max_context_tokens=2048), "gridsim", EnvScore()),
    (ToolCallingAgent(max_turns=2, max_response_tokens=24), "arith", EnvScore()),
    (CoEvolutionAgent(num_parallel=2, max_turns=1, max_response_tokens=16), "arith", Asymmetric()),
    (ThinkerVerifierAgent(max_turns=3, max_response_tokens=16), "arith", EnvScore()),
    (AdversarialAgent(max_response_tokens=16), "arith", EnvScore()),
], ids=["tool_calling-gridsim", "tool_calling-arith", "co_evolution", "thinker_verifier", "adversarial"])
async def test_agents_on_the_tiny_model(session_server, gridsim_url, arith_url, agent, bundle, reward_fn):
    url = gridsim_url if bundle == "gridsim" else arith_url
    if not isinstance(agent, ToolCallingAgent):  # the multi-agent patterns read the task from the row
        from agentrl.envs.bundles import load_bundle

        turn = load_bundle(bundle).episode("eval", 0).first_turn()
        task = {"messages": [{"role": "system", "content": turn.system_prompt},
                             {"role": "user", "content": turn.prompt}],
                "metadata": {"url": url, "split": "eval", "index": 0}}
    else:
        task = row(url, "eval", 0)
    pool = HttpSessionPool(session_server.base_url)
    outputs = await rewarded(agent.play(pool, task, request_kwargs={"temperature": 1.0, "seed": 3}), reward_fn)
    check(outputs, session_server)
    assert {o.base_url for o in outputs} <= {u for _, u in pool.opened}
    assert "reward/avg" in multi_agent_metrics(outputs)
