"""The tool-calling agent against the real env server (loopback) and the scripted chat endpoint."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from agentrl.agents.base import HttpSessionPool
from agentrl.agents.tool_calling import ToolCallingAgent, run
from agentrl.envs.server import build_app, serve_in_background, start_server_in_thread
from agentrl.envs.server.echo import EchoBundle
from agentrl.rewards import EnvScore
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.testing.plays import rewarded
from agentrl.testing.ports import free_port
from agentrl.testing.scripted_chat import sglang_tool_parser
from agentrl.testing.wait import wait_until


def open_session(chat_url: str) -> str:
    sid = httpx.post(f"{chat_url}/sessions", trust_env=False).json()["session_id"]
    return f"{chat_url}/sessions/{sid}"


async def test_optimal_gridsim_episode_earns_one(gridsim_bundle, gridsim_url):
    schedule = gridsim_bundle.row("eval", 5)["optimal_schedule"]
    chat = ScriptedChat([Reply(tool_calls=[tool_call("submit_schedule", {"schedule": schedule})])])
    with chat.serve() as chat_url:
        pool = HttpSessionPool(chat_url)
        row = {"messages": None, "metadata": {"url": gridsim_url, "split": "eval", "index": 5}}
        [out] = await rewarded(ToolCallingAgent(max_turns=4).play(pool, row, request_kwargs={}), EnvScore())
    assert out.reward == 1.0 and out.role == "agent"
    assert out.scores == {"grade": 1.0}
    assert out.tool_calls == 1 and out.failure is None
    assert out.base_url == pool.opened[0][1]
    [request] = chat.requests
    assert request["_session"] == out.base_url.rsplit("/", 1)[1]
    assert {t["function"]["name"] for t in request["tools"]} == {"submit_schedule", "end_turn"}
    assert [m["role"] for m in request["messages"]] == ["system", "user"]


async def test_a_suboptimal_schedule_earns_its_grade(gridsim_bundle, gridsim_url):
    greedy = gridsim_bundle.row("eval", 5)["greedy_schedule"]
    chat = ScriptedChat([Reply(tool_calls=[tool_call("submit_schedule", {"schedule": greedy})])])
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 5})
    assert 0.0 < out["reward"] < 1.0 and out["reward"] == out["agentenv_scores"]["grade"]


async def test_invalid_json_arguments_are_answered_and_counted(gridsim_bundle, gridsim_url):
    schedule = gridsim_bundle.row("eval", 1)["optimal_schedule"]
    chat = ScriptedChat([
        Reply(tool_calls=[tool_call("submit_schedule", '{"schedule": [1, 0,')]),
        Reply(tool_calls=[tool_call("submit_schedule", "[1, 2]")]),
        Reply(tool_calls=[tool_call("submit_schedule", {"schedule": schedule})]),
    ])
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 1})
    assert out["reward"] == 1.0 and "agentenv_failure" not in out
    assert out["agentenv_invalid_calls"] == 2 and out["agentenv_tool_calls"] == 1 and out["agentenv_turns"] == 3
    answers = [m for m in chat.requests[-1]["messages"] if m["role"] == "tool"]
    assert "not valid JSON" in answers[0]["content"] and "not an object" in answers[1]["content"]
    assert answers[0]["tool_call_id"] == chat.requests[-1]["messages"][2]["tool_calls"][0]["id"]


async def test_nan_in_a_models_arguments_is_an_invalid_call_and_never_reaches_the_env(gridsim_bundle, gridsim_url):
    """`NaN`/`Infinity` are not JSON: answered like malformed arguments, so no GridSim submission is spent on them
    (the env server would refuse the frame and the episode would end as an env error)."""
    schedule = gridsim_bundle.row("eval", 2)["optimal_schedule"]
    chat = ScriptedChat([
        Reply(tool_calls=[tool_call("submit_schedule", '{"schedule": [NaN' + ", 0" * 23 + "]}")]),
        Reply(tool_calls=[tool_call("submit_schedule", '{"schedule": [1e400' + ", 0" * 23 + "]}")]),
        Reply(tool_calls=[tool_call("submit_schedule", {"schedule": schedule})]),
    ])
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 2})
    assert out["reward"] == 1.0 and "agentenv_failure" not in out
    assert out["agentenv_invalid_calls"] == 2 and out["agentenv_tool_calls"] == 1
    answers = [m["content"] for m in chat.requests[-1]["messages"] if m["role"] == "tool"]
    assert "NaN is not a JSON number" in answers[0] and "too large" in answers[1]


async def test_a_plain_reply_ends_the_turn_and_is_graded(arith_bundle, arith_url):
    label = arith_bundle.row("eval", 7)["label"]
    chat = ScriptedChat([Reply(content=f"Let me think.\nAnswer: {label}")])
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": arith_url, "split": "eval", "index": 7})
    assert out["reward"] == 1.0 and out["agentenv_scores"] == {"correct": 1.0} and out["agentenv_tool_calls"] == 0


async def test_multi_turn_task_gets_the_next_prompt_as_a_user_message(tmp_path):
    bundle = EchoBundle(train=2, eval=1, turns=2)
    chat = ScriptedChat([Reply(content="first"), Reply(tool_calls=[tool_call("end_turn", {"response": "x"})])])
    with serve_in_background(build_app(bundle)) as env_url, chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": env_url, "split": "train", "index": 1})
    assert out["agentenv_scores"] == {"match": 0.0} and out["agentenv_turns"] == 2
    assert chat.requests[1]["messages"][-1]["role"] == "user"
    assert "answer-train-1" in chat.requests[1]["messages"][-1]["content"]


async def test_max_turns_is_enforced(gridsim_url):
    chat = ScriptedChat([], default=Reply(tool_calls=[tool_call("submit_schedule", "not json")]))
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 0},
                        max_turns=3)
    assert len(chat.requests) == 3 and out["agentenv_turns"] == 3 and out["agentenv_invalid_calls"] == 3
    # The env scored the day at the end (no submission: grade 0); that is an outcome, not a failure.
    assert out["reward"] == 0.0 and out["agentenv_scores"] == {"grade": 0.0} and "agentenv_failure" not in out


async def test_each_turn_samples_with_its_own_seed(gridsim_url):
    """Engines re-seed on every request: one seed on every turn would repeat the same random draws (a retried
    bad call repeats). Turn 0 keeps the play's seed; later turns derive theirs, the same ones on a replay."""
    seeds = []
    for _ in range(2):
        chat = ScriptedChat([], default=Reply(tool_calls=[tool_call("submit_schedule", "not json")]))
        with chat.serve() as chat_url:
            await run(open_session(chat_url), None, {"seed": 5, "temperature": 1.0},
                      {"url": gridsim_url, "split": "eval", "index": 0}, max_turns=3)
        seeds.append([body["seed"] for body in chat.requests])
    assert seeds[0][0] == 5 and len(set(seeds[0])) == 3 and seeds[0] == seeds[1]


async def test_a_tool_call_block_the_parser_dropped_is_an_invalid_call(gridsim_bundle, gridsim_url):
    # The endpoint parses tool calls from the model's text as SGLang's qwen25 parser does: a block whose JSON
    # does not parse vanishes (no calls, empty content, finish_reason tool_calls). The agent must answer it as
    # an invalid call and give the model its next turn, not end the episode at reward 0.
    schedule = gridsim_bundle.row("eval", 2)["optimal_schedule"]
    valid = json.dumps({"name": "submit_schedule", "arguments": {"schedule": schedule}})
    chat = ScriptedChat([Reply(content='<tool_call>{"name": "submit_schedule", "arguments": {"schedule": [1, 0,'
                                       '</tool_call>'),
                         Reply(content="Let me fix that.<tool_call>{oops</tool_call>"),
                         Reply(content=f"<tool_call>{valid}</tool_call>")], tool_parser=sglang_tool_parser)
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 2})
    assert out["reward"] == 1.0 and "agentenv_failure" not in out
    assert out["agentenv_invalid_calls"] == 2 and out["agentenv_tool_calls"] == 1 and out["agentenv_turns"] == 3
    told = chat.requests[1]["messages"][-1]
    assert told["role"] == "user" and "no call could be read" in told["content"]
    assert "no call could be read" in chat.requests[2]["messages"][-1]["content"]


async def test_a_tool_call_block_left_in_the_text_is_an_invalid_call(gridsim_bundle, gridsim_url):
    # An endpoint without a tool parser hands the block back as text: the same answer, the same count.
    schedule = gridsim_bundle.row("eval", 2)["optimal_schedule"]
    chat = ScriptedChat([Reply(content='<tool_call>{"name": "submit_schedule", "arguments": {</tool_call>'),
                         Reply(tool_calls=[tool_call("submit_schedule", {"schedule": schedule})])])
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 2})
    assert out["reward"] == 1.0 and out["agentenv_invalid_calls"] == 1 and out["agentenv_turns"] == 2
    assert "could not be parsed" in chat.requests[1]["messages"][-1]["content"]


async def test_a_dead_env_server_is_flagged():
    port = free_port()
    chat = ScriptedChat([Reply(content="never asked")])
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {},
                        {"url": f"http://127.0.0.1:{port}", "split": "eval", "index": 0}, connect_timeout=0.5)
    # Nothing listens: flagged env_unreachable within connect_timeout (not reset_timeout), naming the URL.
    assert out["agentenv_failure"] == "env_unreachable" and out["reward"] == 0.0 and not chat.requests
    assert f"127.0.0.1:{port}" in out["agentenv_error"]


async def test_an_env_server_dying_mid_episode_is_flagged(tmp_path):
    url, stop = start_server_in_thread(build_app(EchoBundle(marker_dir=str(tmp_path))))

    def script(body, session_id):
        stop(5)  # the env server goes away while the model is thinking
        return Reply(tool_calls=[tool_call("echo", {"text": "hi"})])

    with ScriptedChat(script).serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": url, "split": "train", "index": 0})
    assert out["agentenv_failure"] == "env_gone" and out["reward"] == 0.0
    assert list(tmp_path.glob("closed-*")), "the server's shutdown tore the episode down"


async def test_a_slow_tool_is_flagged_tool_timeout(tmp_path):
    app = build_app(EchoBundle(marker_dir=str(tmp_path)), tool_timeout=0.3)
    chat = ScriptedChat([Reply(tool_calls=[tool_call("sleep", {"seconds": 2})])])
    with serve_in_background(app) as env_url, chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": env_url, "split": "train", "index": 0})
        assert wait_until(lambda: not app.state.served.sessions)
    assert out["agentenv_failure"] == "tool_timeout" and out["reward"] == 0.0


async def test_a_model_timeout_is_flagged_and_the_episode_closed(tmp_path):
    app = build_app(EchoBundle(marker_dir=str(tmp_path)))
    chat = ScriptedChat([Reply(content="too late", delay=4.0)])
    with serve_in_background(app) as env_url, chat.serve() as chat_url:
        started = time.monotonic()
        out = await run(open_session(chat_url), None, {}, {"url": env_url, "split": "train", "index": 0},
                        model_timeout=0.3)
        assert time.monotonic() - started < 3.5  # well under the reply's 4 s delay, generous for a loaded box
        assert wait_until(lambda: not app.state.served.sessions and list(tmp_path.glob("closed-*")))
    assert out["agentenv_failure"] == "model_timeout" and out["reward"] == 0.0


async def test_over_budget_ends_flagged_using_usage_counts(gridsim_url):
    chat = ScriptedChat([Reply(tool_calls=[tool_call("submit_schedule", "{")], prompt_tokens=900)],
                        default=Reply(content="unreachable"))
    with chat.serve() as chat_url:
        out = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 0},
                        max_context_tokens=1000, max_response_tokens=200)
        assert len(chat.requests) == 1 and chat.requests[0]["max_tokens"] == 200
        tiny = await run(open_session(chat_url), None, {}, {"url": gridsim_url, "split": "eval", "index": 0},
                         max_context_tokens=50)
    assert out["agentenv_failure"] == "over_budget" and out["agentenv_turns"] == 1 and out["reward"] == 0.0
    assert tiny["agentenv_failure"] == "over_budget" and tiny["agentenv_turns"] == 0


async def test_reward_group_is_applied_and_its_error_flags(gridsim_bundle, gridsim_url):
    schedule = gridsim_bundle.row("eval", 2)["optimal_schedule"]
    chat = ScriptedChat([], default=Reply(tool_calls=[tool_call("submit_schedule", {"schedule": schedule})]))
    row = {"messages": None, "metadata": {"url": gridsim_url, "split": "eval", "index": 2}}
    with chat.serve() as chat_url:
        pool = HttpSessionPool(chat_url)
        [bad] = await rewarded(ToolCallingAgent().play(pool, row, request_kwargs={}), EnvScore(score="nope"))
        [good] = await rewarded(ToolCallingAgent().play(pool, row, request_kwargs={}), EnvScore(score="grade"))
    assert bad.reward == 0.0 and bad.failure == "no_reward" and "nope" in \
        bad.error
    assert good.reward == 1.0


async def test_parallel_episodes_on_one_endpoint(gridsim_bundle, gridsim_url):
    def script(body, session_id):
        prices = body["messages"][1]["content"]
        index = next(i for i in range(8) if gridsim_bundle.episode("eval", i).first_turn().prompt == prices)
        return Reply(tool_calls=[tool_call("submit_schedule",
                                           {"schedule": gridsim_bundle.row("eval", index)["optimal_schedule"]})])

    with ScriptedChat(script).serve() as chat_url:
        outs = await asyncio.gather(*(run(open_session(chat_url), None, {},
                                          {"url": gridsim_url, "split": "eval", "index": i}) for i in range(8)))
    assert [o["reward"] for o in outs] == [1.0] * 8


def test_agent_rejects_unknown_settings():
    with pytest.raises(TypeError, match="num_parallel"):
        ToolCallingAgent(num_parallel=3)


def test_env_failure_maps_each_client_error_once_for_reset_and_mid_episode():
    """The one mapping (`agents/episode.env_failure`): a refused token is env_auth at reset and mid-episode alike
    (it was env_gone mid-episode); a timeout is the deploy's at reset and the tool's in the episode."""
    from agentrl.agents.episode import env_failure
    from agentrl.agents.record import Failure
    from agentrl.envs.connection import (
        EnvAuthError,
        EnvConnectionError,
        EnvProtocolError,
        EnvResetError,
        EnvTimeoutError,
        EnvUnreachableError,
    )

    cases = {  # error: (at reset, mid-episode)
        EnvAuthError("refused (close 1008)"): (Failure.ENV_AUTH, Failure.ENV_AUTH),
        EnvTimeoutError("slow"): (Failure.DEPLOY, Failure.TOOL_TIMEOUT),
        EnvResetError("no deploy"): (Failure.DEPLOY, Failure.ENV_ERROR),
        EnvUnreachableError("nothing listens", "http://127.0.0.1:9"): (Failure.ENV_UNREACHABLE, Failure.ENV_GONE),
        EnvConnectionError("dropped"): (Failure.ENV_GONE, Failure.ENV_GONE),
        EnvProtocolError("garbage frame"): (Failure.ENV_ERROR, Failure.ENV_ERROR),
    }
    got = {exc: (env_failure(exc, started=False), env_failure(exc, started=True)) for exc in cases}
    assert got == cases
