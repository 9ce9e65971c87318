"""`agent=self_play` on `env=textarena`: real TextArena TicTacToe matches through the env server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrl.agents.base import HttpSessionPool
from agentrl.agents.record import Failure
from agentrl.agents.self_play import SelfPlayAgent, seat_of
from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.textarena.bundle import listed_moves
from agentrl.envs.server import build_app, serve_in_background
from agentrl.rewards import EnvScore
from agentrl.testing import ScriptedChat
from agentrl.testing.plays import rewarded


def first_listed_move(body: dict, session_id: str | None) -> str:
    """A scripted player: the first move the last observation lists."""
    return listed_moves(body["messages"][-1]["content"])[0]


@pytest.fixture(scope="module")
def ttt():
    return load_bundle("textarena", game="TicTacToe-v0", train_size=4, eval_size=4, seed=0)


@pytest.fixture(scope="module")
def ttt_url(ttt) -> Iterator[str]:
    with serve_in_background(build_app(ttt, max_concurrent_envs=4, tool_timeout=30)) as url:
        yield url


async def play(url: str, split: str, index: int, agent: SelfPlayAgent, script=first_listed_move):
    chat = ScriptedChat(script)
    with chat.serve() as chat_url:
        pool = HttpSessionPool(chat_url)
        row = {"messages": None, "metadata": {"url": url, "split": split, "index": index}}
        return await rewarded(agent.play(pool, row, request_kwargs={}), EnvScore()), chat


async def test_self_play_rewards_each_seat_by_its_own_outcome(ttt_url):
    # Both seats take the first free cell: O at 0, 2, 4, 6 wins on the diagonal before X completes a line.
    rollouts, chat = await play(ttt_url, "train", 0, SelfPlayAgent())
    assert [(r.role, r.reward, r.failure) for r in rollouts] == [("player_0", 1.0, None), ("player_1", 0.0, None)]
    assert rollouts[0].turns == 4 and rollouts[1].turns == 3 and rollouts[0].play_id == rollouts[1].play_id
    first = chat.requests[0]["messages"]
    assert seat_of(first[0]["content"]) == 0 and "You are Player 0 in Tic Tac Toe" in first[1]["content"]
    # Each seat sees only its own player's view.
    x_view = [r for r in chat.requests if seat_of(r["messages"][0]["content"]) == 1][0]["messages"]
    assert "You are Player 1 in Tic Tac Toe" in x_view[1]["content"]


async def test_every_seat_and_turn_samples_with_its_own_seed(ttt_url):
    """Both seats on one seed, every turn, would draw the same random numbers all match long."""
    chat = ScriptedChat(first_listed_move)
    with chat.serve() as chat_url:
        row = {"messages": None, "metadata": {"url": ttt_url, "split": "train", "index": 0}}
        await SelfPlayAgent().play(HttpSessionPool(chat_url), row, request_kwargs={"seed": 11, "temperature": 1.0})
    seeds = [(seat_of(r["messages"][0]["content"]), r["seed"]) for r in chat.requests]
    assert len(seeds) == 7 and len({s for _, s in seeds}) == 7 and seeds[0] == (0, 11)


async def test_against_the_scripted_opponent_the_agent_plays_its_seat_only(ttt, ttt_url):
    for index in range(2):  # seat 0, then seat 1
        rollouts, chat = await play(ttt_url, "eval", index, SelfPlayAgent())
        [r] = rollouts
        assert r.role == f"player_{index}" and r.failure is None and r.details["seat"] == index
        assert r.reward in (0.0, 0.5, 1.0) and r.scores == {"win": r.reward}
        assert {seat_of(q["messages"][0]["content"]) for q in chat.requests} == {index}
        # The same match replayed directly gives the same outcome: the opponent's moves are seeded.
        episode = ttt.episode("eval", index)
        turn = episode.first_turn()
        while turn is not None:
            turn = episode.end_turn(listed_moves(turn.prompt)[0])
        assert episode.scores() == {"win": r.reward}


async def test_a_game_with_more_seats_than_roles_is_flagged_naming_agent_roles(ttt_url):
    agent = SelfPlayAgent(roles=[{"name": "solo"}])
    rollouts, _ = await play(ttt_url, "train", 1, agent)
    [r] = rollouts
    assert r.failure == Failure.AGENT_ERROR and "agent.roles has 1 role(s)" in r.error and r.reward == 0.0


async def test_a_match_longer_than_max_turns_flags_every_seat(ttt_url):
    rollouts, _ = await play(ttt_url, "train", 2, SelfPlayAgent(max_turns=3))
    assert [r.failure for r in rollouts] == [Failure.MAX_TURNS, Failure.MAX_TURNS]


def test_bad_game_settings_fail_naming_the_setting():
    with pytest.raises(ValueError, match=r"env.game='TicTacTo-v0'.*not found"):
        load_bundle("textarena", game="TicTacTo-v0")
    with pytest.raises(ValueError, match="env.game=TicTacToe-v0 refuses env.num_players=3"):
        load_bundle("textarena", game="TicTacToe-v0", num_players=3)
    with pytest.raises(ValueError, match="env.eval_opponent='smart'"):
        load_bundle("textarena", eval_opponent="smart")


def test_demonstrations_play_listed_moves_for_one_seat(ttt):
    chat = ttt.demonstration("train", 1, "random")
    assert seat_of(chat[0]["content"]) == 1
    moves = [m["content"] for m in chat if m["role"] == "assistant"]
    prompts = [m["content"] for m in chat if m["role"] == "user"]
    assert moves and all(move in listed_moves(p) for move, p in zip(moves, prompts, strict=True))


def test_more_seats_than_roles_fails_when_the_run_is_planned(ttt, tmp_path):
    from hydra import compose, initialize_config_dir

    from agentrl.config import register_configs
    from agentrl.config.locate import conf_dir
    from agentrl.plan import PlanError, build_plan

    assert SelfPlayAgent().plan_problem(ttt) is None
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["env=textarena", "agent=self_play", "agent.roles=[{name: solo}]",
                                           "trainer.warm_start.teacher=random", "env.train_size=2",
                                           "env.eval_size=2"])
    with pytest.raises(PlanError, match=r"agent.roles has 1 role\(s\) \(solo\) but the game has 2 seats"):
        build_plan(cfg, choices={}, run_dir=tmp_path / "run")


def test_prompt_chars_keeps_the_end_of_each_observation():
    bundle = load_bundle("textarena", train_size=2, eval_size=2, prompt_chars=120)
    turn = bundle.episode("eval", 0).first_turn()
    assert turn.prompt.startswith("...") and len(turn.prompt) == 123 and listed_moves(turn.prompt)


async def test_a_refused_token_flags_every_seat_env_auth_as_the_tool_calling_agent_does(ttt, monkeypatch):
    """One mapping of env errors to failures: a self-play reset refused for its token is `env_auth`, not
    `env_gone` (the env server is there; the run's token is wrong)."""
    from agentrl.agents.tool_calling import ToolCallingAgent

    monkeypatch.setenv("SELF_PLAY_TEST_TOKEN", "wrong-token")
    with serve_in_background(build_app(ttt, max_concurrent_envs=2, token="s3cret")) as url:
        row = {"messages": None, "metadata": {"url": url, "split": "train", "index": 0,
                                               "token_var": "SELF_PLAY_TEST_TOKEN"}}
        chat = ScriptedChat(first_listed_move)
        with chat.serve() as chat_url:
            [seat] = (await SelfPlayAgent().play(HttpSessionPool(chat_url), row, request_kwargs={})).rollouts
            [agent] = (await ToolCallingAgent().play(HttpSessionPool(chat_url), row, request_kwargs={})).rollouts
    assert (seat.failure, agent.failure) == (Failure.ENV_AUTH, Failure.ENV_AUTH) and not chat.requests
