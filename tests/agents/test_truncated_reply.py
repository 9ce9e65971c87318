"""A reply cut at max_response_tokens before it made a tool call is flagged truncated and never scored as an
answer (a real model's prose runs past the limit; scoring its first words as a final answer would reward them)."""

from __future__ import annotations

from agentrl.agents.episode import play_episode
from agentrl.agents.record import Failure
from agentrl.config.agent import ToolCallingAgentConfig
from agentrl.testing import Reply, ScriptedChat


def _row(arith_url: str) -> dict:
    return {"url": arith_url, "split": "eval", "index": 0}


async def test_a_reply_cut_without_a_tool_call_is_flagged_not_scored(arith_url, arith_bundle):
    label = arith_bundle.row("eval", 0)["label"]
    # The cut reply holds the right answer: scored, it would earn 1.0.
    chat = ScriptedChat([Reply(content=f"Let me think. The answer is {label}", finish_reason="length")])
    with chat.serve() as url:
        record = await play_episode(url, None, {}, _row(arith_url), ToolCallingAgentConfig(max_turns=3))
    assert record.failure == Failure.TRUNCATED, record
    assert not record.scores and record.env_reward is None and record.score == 0.0
    assert len(chat.requests) == 1  # not continued by another turn either


async def test_a_finished_reply_without_a_tool_call_is_still_the_answer(arith_url):
    chat = ScriptedChat([Reply(content="The answer is 12345")])
    with chat.serve() as url:
        record = await play_episode(url, None, {}, _row(arith_url), ToolCallingAgentConfig(max_turns=3))
    assert record.failure is None and record.scores == {"correct": 0.0}
