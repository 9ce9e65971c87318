"""The end-of-run health summary: a recipe's `agent.health` ranges, judged on the metrics the run logged.

The metrics come from `multi_agent_metrics` over real co-evolution plays (env server + scripted endpoint) in
which the rewriters are verbose: their share of the trained tokens must be flagged.
"""

from __future__ import annotations

import pytest

from agentrl.agents.base import HttpSessionPool, multi_agent_metrics
from agentrl.agents.co_evolution import CoEvolutionAgent
from agentrl.config.agent import CoEvolutionAgentConfig
from agentrl.rewards import Asymmetric
from agentrl.testing import Reply, ScriptedChat
from agentrl.testing.plays import rewarded
from agentrl.trainers.grpo.health import HealthWatch

RANGES = {"multi_agent/avg_turns": [1, 1], "multi_agent/early_termination_rate": [0, 0.5],
          "loss_mask/role_split/rewriter": [0.2, 0.7]}


async def _step_metrics(arith_url: str, rewriter_words: int) -> dict[str, float]:
    def script(body, sid):
        system = body["messages"][0]["content"]
        if "Pick the best" in system:
            return Reply(content="Judgment: 0")
        if "improved solution" in system:
            return Reply(content="word " * rewriter_words + "Answer: 19")
        return Reply(content="Answer: 19")

    row = {"messages": [{"role": "user", "content": "What is 11 × 2 − 3?"}],
           "metadata": {"url": arith_url, "split": "train", "index": 0}}
    with ScriptedChat(script).serve() as url:
        outs = await rewarded(CoEvolutionAgent(num_parallel=3, max_turns=1, max_response_tokens=None).play(
            HttpSessionPool(url), row, request_kwargs={}), Asymmetric())
    return multi_agent_metrics(outs)


async def test_a_verbose_role_is_flagged(arith_url):
    healthy, verbose = await _step_metrics(arith_url, 0), await _step_metrics(arith_url, 200)
    assert verbose["loss_mask/role_split/rewriter"] > 0.9 > 0.7 > healthy["loss_mask/role_split/rewriter"]

    ok = HealthWatch(RANGES)
    for _ in range(3):
        ok.add(healthy)
    assert ok.summary().startswith("health: ok, 3 of 3 metrics in range")
    assert ok.metrics() == {"health/out_of_range": 0.0}

    watch = HealthWatch(RANGES, window=2)
    for metrics in (healthy, healthy, verbose, verbose):  # only the last 2 steps are judged
        watch.add(metrics)
    line = watch.summary()
    assert "\n" not in line and "1 of 3 metrics OUT OF RANGE" in line
    assert "loss_mask/role_split/rewriter" in line and "outside [0.2, 0.7]" in line
    assert "avg_turns" not in line and watch.metrics() == {"health/out_of_range": 1.0}


def test_never_logged_and_undeclared():
    watch = HealthWatch({"multi_agent/avg_turns": [1, 2], "loss_mask/role_split": [0.5, 1]})
    watch.add({"multi_agent/avg_turns": 1.5, "train/reward": 0.3})
    assert watch.summary() == ("health: ok, 1 of 2 metrics in range (mean of the last 10 steps); "
                               "never logged: loss_mask/role_split")
    watch.add({"multi_agent/avg_turns": 9.5})
    assert "multi_agent/avg_turns 5.5 outside [1, 2]" in watch.summary()
    # No ranges declared: nothing to say (the console stays quiet), nothing to log.
    assert HealthWatch(None).summary() == "" and HealthWatch({}).metrics() == {}


def test_ranges_are_checked_in_the_config():
    assert CoEvolutionAgentConfig(health={"multi_agent/avg_turns": [1, 2]}).health
    for bad in ([2, 1], [1], ["a", 2]):
        with pytest.raises(ValueError, match="agent.health.multi_agent/avg_turns"):
            CoEvolutionAgentConfig(health={"multi_agent/avg_turns": bad})
