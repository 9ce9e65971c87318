"""Rows written from a live server and played by the agent; the group filter and Miles reward hook."""

from __future__ import annotations

import json

import pytest
from miles.rollout.filter_hub.base_types import DynamicFilterOutput
from miles.utils.types import Sample

from agentrl.agents.base import HttpSessionPool
from agentrl.agents.tool_calling import ToolCallingAgent, run
from agentrl.envs.server import build_app, serve_in_background
from agentrl.envs.server.echo import EchoBundle
from agentrl.rewards import EnvScore
from agentrl.rows import main, read_rows, write_rows
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.trainers.miles.hooks import filter_scored_groups, keep_scored_groups, reward_func


def test_rows_round_trip_through_the_agent(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROWS_TEST_TOKEN", "s3cret-token")
    app = build_app(EchoBundle(train=4, eval=2, turns=2), token="s3cret-token")
    with serve_in_background(app) as url:
        assert main([url, str(tmp_path), "--max-turns", "3", "--token-var", "ROWS_TEST_TOKEN"]) == 0
        assert capsys.readouterr().out.strip() == f"wrote all.jsonl, eval.jsonl, train.jsonl to {tmp_path}"
        rows = {s: read_rows(tmp_path / f"{s}.jsonl") for s in ("all", "train", "eval")}
        assert [len(rows[s]) for s in ("all", "train", "eval")] == [6, 4, 2]
        assert "s3cret" not in "".join(p.read_text() for p in tmp_path.glob("*.jsonl"))
        row = rows["all"][5]
        meta = row["metadata"]
        assert (meta["split"], meta["index"], meta["task_id"]) == ("all", 5, "echo-eval-1")
        assert [t["function"]["name"] for t in meta["tools"]] == ["echo", "sleep", "finish", "end_turn"]
        assert (meta["max_turns"], meta["tool_timeout"], meta["token_var"], meta["url"]) == (3, 60.0,
                                                                                              "ROWS_TEST_TOKEN", url)
        assert [m["role"] for m in row["messages"]] == ["system", "user"] and "answer-eval-1" in \
            row["messages"][1]["content"]
        chat = ScriptedChat([Reply(content="answer-eval-1")] * 2)
        with chat.serve() as chat_url:
            [out] = await_play(ToolCallingAgent(), HttpSessionPool(chat_url), row)
        assert out.reward == 1.0 and out.turns == 2
        assert chat.requests[0]["tools"] == meta["tools"] and chat.requests[0]["messages"] == row["messages"]


def await_play(agent, pool, row):
    import asyncio

    from agentrl.testing.plays import rewarded

    return asyncio.run(rewarded(agent.play(pool, row, request_kwargs={"temperature": 0.7}), EnvScore()))


def test_write_rows_api_on_gridsim(gridsim_url, tmp_path):
    paths = write_rows(gridsim_url, tmp_path, max_turns=2, concurrency=2)
    assert sorted(paths) == ["all", "eval", "train"]
    evals = read_rows(paths["eval"])
    assert len(evals) == 200 and evals[3]["metadata"]["task_id"].startswith("gridsim-eval-0003")
    first_train = read_rows(paths["all"])[200]
    assert first_train["metadata"]["task_id"] == read_rows(paths["train"])[0]["metadata"]["task_id"]


def test_splits_come_from_the_reset_error_when_metadata_lists_none():
    import asyncio

    from fastapi.responses import JSONResponse

    from agentrl.rows import discover_splits

    app = build_app(EchoBundle(train=4, eval=2))

    @app.middleware("http")
    async def metadata_without_splits(request, call_next):  # an OpenEnv server that does not list its splits
        if request.url.path == "/metadata":
            return JSONResponse({"name": "echo"})
        return await call_next(request)

    with serve_in_background(app) as url:
        assert asyncio.run(discover_splits(url)) == {"all": 6, "train": 4, "eval": 2}


def test_read_rows_names_a_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [], "metadata": {}}) + "\n" + json.dumps({"messages": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_rows(path)


def test_a_row_without_url_is_flagged_not_raised():
    import asyncio

    out = asyncio.run(run("http://127.0.0.1:9", None, {}, {"split": "train", "index": 0}))
    assert out["agentenv_failure"] == "bad_row" and out["reward"] == 0.0


def miles_sample(sample_reward, **metadata) -> Sample:
    s = Sample(metadata=metadata)
    s.reward = sample_reward
    s.status = Sample.Status.COMPLETED
    return s


def test_group_filter_drops_flagged_and_unrewarded_groups():
    good = [miles_sample(1.0, reward=1.0), miles_sample(0.0, reward=0.0)]
    flagged = [miles_sample(1.0, reward=1.0), miles_sample(0.0, reward=0.0, agentenv_failure="model_timeout")]
    crashed = [miles_sample(1.0, reward=1.0), miles_sample(0.0)]  # the agent returned nothing
    aborted = [miles_sample(1.0, reward=1.0), Sample()]
    aborted[1].status = Sample.Status.ABORTED
    assert keep_scored_groups(None, good) and keep_scored_groups(None, [good])  # nested multi-sample groups
    assert not any(keep_scored_groups(None, g) for g in (flagged, crashed, aborted))
    out = filter_scored_groups(None, flagged)
    assert isinstance(out, DynamicFilterOutput) and (out.keep, out.reason) == (False, "agentenv_failed")
    assert filter_scored_groups(None, good) == DynamicFilterOutput(keep=True, reason=None)


def test_group_filter_drops_groups_without_signal_like_the_built_in_trainer(monkeypatch):
    from agentrl.trainers.miles import hooks as miles_hooks

    monkeypatch.setattr(miles_hooks._streak, "in_a_row", 0)
    tie = [miles_sample(1.0, reward=1.0), miles_sample(1.0, reward=1.0)]
    assert filter_scored_groups(None, tie) == DynamicFilterOutput(keep=False, reason="no_signal")
    monkeypatch.setenv(miles_hooks.DROP_NO_SIGNAL_ENV, "0")
    assert filter_scored_groups(None, tie).keep


def test_miles_loop_stops_when_no_group_ever_has_signal(monkeypatch):
    from agentrl import group_filter
    from agentrl.trainers.miles import hooks as miles_hooks

    monkeypatch.setattr(miles_hooks._streak, "in_a_row", 0)
    monkeypatch.setenv(miles_hooks.MAX_DROPS_ENV, "2")
    tie = [miles_sample(0.0, reward=0.0), miles_sample(0.0, reward=0.0)]
    filter_scored_groups(None, tie)
    filter_scored_groups(None, tie)
    with pytest.raises(group_filter.AllGroupsFailing, match=r"3 groups in a row were dropped as no_signal"):
        filter_scored_groups(None, tie)


def test_group_filter_stops_a_run_whose_every_group_fails(monkeypatch):
    from agentrl import group_filter
    from agentrl.trainers.miles import hooks as miles_hooks

    monkeypatch.setattr(miles_hooks._streak, "in_a_row", 0)
    monkeypatch.setenv(miles_hooks.MAX_DROPS_ENV, "3")
    good = [miles_sample(1.0, reward=1.0), miles_sample(0.0, reward=0.0)]
    flagged = [miles_sample(0.0, reward=0.0, agentenv_failure="env_error", agentenv_error="connection refused")]
    for _ in range(3):
        assert not filter_scored_groups(None, flagged).keep
    assert filter_scored_groups(None, good).keep  # a kept group starts the count again
    for _ in range(3):
        filter_scored_groups(None, flagged)
    with pytest.raises(group_filter.AllGroupsFailing, match=r"4 groups in a row .* env_error: connection refused"):
        filter_scored_groups(None, flagged)


async def test_miles_reward_hook_handles_one_sample_and_a_list():
    assert await reward_func(None, miles_sample(None, reward=0.75)) == 0.75
    batch = [miles_sample(None, reward=0.5), miles_sample(None, reward=1.0, agentenv_failure="deploy"),
             miles_sample(None)]
    assert await reward_func(None, batch) == [0.5, 0.0, 0.0]


async def test_eval_scores_a_flagged_rollout_zero(gridsim_url):
    # The same agent function in eval: nothing is filtered; a flagged rollout simply scores 0.
    chat = ScriptedChat([Reply(tool_calls=[tool_call("submit_schedule", "{")], delay=1.0)])
    with chat.serve() as chat_url:
        sid = (await _post(f"{chat_url}/sessions"))["session_id"]
        out = await run(f"{chat_url}/sessions/{sid}", None, {}, {"url": gridsim_url, "split": "eval", "index": 0},
                        model_timeout=0.2)
    assert out["reward"] == 0.0 and await reward_func(None, Sample(metadata=out)) == 0.0


async def _post(url):
    import httpx

    async with httpx.AsyncClient(trust_env=False) as client:
        return (await client.post(url)).json()
