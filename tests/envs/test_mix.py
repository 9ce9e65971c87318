"""`env=mix`: several real bundles (GridSim and reasoning-gym) served as one, rows drawn by weight, each row played
by its own bundle, metrics per bundle, the warm start's demonstrations from each bundle's teacher, and the config's
mistakes refused by name when the plan is built."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.agents.record import Rollout
from agentrl.agents.tool_calling import run
from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.mix import shares
from agentrl.envs.server import build_app, serve_in_background
from agentrl.plan import PlanError, build_plan
from agentrl.play.evaluate import reward_metrics
from agentrl.play.rollout import make_row
from agentrl.testing import Reply, ScriptedChat
from agentrl.testing.config import compose_config
from agentrl.trainers.common.rollout_metrics import rollout_metrics
from agentrl.trainers.common.step_fill import RowStream
from agentrl.trainers.sft.demonstrations import demonstration_chats

RG = {"env": "reasoning_gym", "weight": 0.3, "datasets": {"chain_sum": {}}, "level": 0, "train_size": 40,
      "eval_size": 6}
MIX = {"bundles": {"gridsim": 0.7, "rg": RG}, "train_size": 200}


@pytest.fixture(scope="module")
def mix():
    return load_bundle("mix", **MIX)


def group_of(bundle: Any, split: str, index: int) -> str:
    return bundle.task_info(split, index).extra["bundle"]


def test_shares_sum_to_the_total_in_proportion():
    assert shares([0.7, 0.3], 200) == [140, 60]
    assert shares([1, 1, 1], 10) == [4, 3, 3] and sum(shares([0.5, 0.25, 0.25], 7)) == 7


def test_rows_are_drawn_by_weight_seeded_each_carrying_its_bundle(mix):
    assert mix.splits()["train"] == 200
    stream = RowStream(mix.splits()["train"], seed=5)
    drawn = [group_of(mix, "train", stream.next()) for _ in range(1000)]
    # Each epoch (200 draws) holds every group's share exactly; any window is close to it.
    assert Counter(drawn[:200]) == {"gridsim": 140, "rg": 60}
    assert Counter(drawn) == {"gridsim": 700, "rg": 300}
    assert 0.55 < Counter(drawn[:50])["gridsim"] / 50 < 0.85
    again = load_bundle("mix", **MIX)
    ids = [mix.task_info("train", i).task_id for i in range(200)]
    assert ids == [again.task_info("train", i).task_id for i in range(200)]
    reseeded = load_bundle("mix", **MIX, seed=1)
    assert ids != [reseeded.task_info("train", i).task_id for i in range(200)]
    # A row is its bundle's task, played by its bundle's episode (its tools, its task id).
    tools = {group_of(mix, "train", i): [t["function"]["name"] for t in mix.episode("train", i).first_turn().tools]
             for i in range(20)}
    assert tools == {"gridsim": ["submit_schedule"], "rg": ["answer"]}
    assert all(mix.task_info("train", i).task_id.startswith(group_of(mix, "train", i) + "/") for i in range(20))
    # The rg group's 60 rows cycle through its 40 train tasks: every task once before any repeats.
    rg_tasks = [mix.locate("train", i)[2] for i in range(200) if group_of(mix, "train", i) == "rg"]
    assert len(set(rg_tasks)) == 40


def test_a_list_of_groups_names_each_group_by_its_name_or_its_env():
    listed = load_bundle("mix", bundles=[{"name": "full", "env": "gridsim", "weight": 1},
                                         {"env": "gridsim", "weight": 3, "prompt_style": "compact"}], train_size=8)
    assert Counter(group_of(listed, "train", i) for i in range(8)) == {"full": 2, "gridsim": 6}
    assert [m.bundle.prompt_style for m in listed.members] == ["full", "compact"]


def test_the_eval_split_takes_each_bundles_eval_tasks_in_turn(mix):
    gridsim_eval = load_bundle("gridsim").splits()["eval"]
    assert mix.splits()["eval"] == gridsim_eval + 6
    first = [group_of(mix, "eval", i) for i in range(12)]
    assert first == ["gridsim", "rg"] * 6
    # The same tasks as each bundle's own eval split's first ones.
    assert [mix.locate("eval", i)[1:] for i in (0, 1, 2, 3)] == [("eval", 0), ("eval", 0), ("eval", 1), ("eval", 1)]


def play_directly(mix, split: str, index: int, right: bool) -> float:
    """Play a task with the right answer (the teacher's) or a wrong one; returns the grade."""
    episode = mix.episode(split, index)
    call = mix.demonstration(split, index, "each")[2]["tool_calls"][0]["function"]
    arguments = json.loads(call["arguments"])
    if not right:
        arguments = {"answer": "no idea"} if call["name"] == "answer" else {"schedule": [0] * 24}
    episode.first_turn()
    episode.call_tool(call["name"], arguments)
    [score] = episode.scores().values()
    return score


def test_train_and_eval_metrics_are_reported_per_bundle(mix):
    plays = []
    for i in range(8):  # gridsim answered right, rg wrong: the per-bundle means tell them apart
        right = group_of(mix, "eval", i) == "gridsim"
        score = play_directly(mix, "eval", i, right)
        plays.append(Rollout(score=score, reward=score, row=make_row(mix, "eval", i, "http://env", {})))
    metrics = reward_metrics(plays, "eval", mix.eval_breakdown)
    assert metrics["eval/reward/gridsim"] == 1.0 and metrics["eval/reward/rg"] == 0.0
    assert metrics["eval/reward"] == 0.5 and "eval/reward_chain_sum" in metrics and "eval/reward_1h" in metrics
    train = [Rollout(score=s, reward=s, row=make_row(mix, "train", i, "http://env", {}))
             for i in range(12) for s in [play_directly(mix, "train", i, group_of(mix, "train", i) == "rg")]]
    by_group = Counter(group_of(mix, "train", i) for i in range(12))
    got = rollout_metrics(train, mix.train_breakdown)
    assert got["train/reward/rg"] == 1.0 and got["train/reward/gridsim"] < 1.0
    assert math.isclose(got["train/reward"], (by_group["rg"] + sum(
        r.reward for r in train if r.row["metadata"]["task"]["bundle"] == "gridsim")) / 12)
    assert "train/reward/rg" not in rollout_metrics(train)  # a bundle without a train breakdown: the mean only


async def test_each_row_is_played_over_the_env_server_by_its_bundles_episode(mix):
    eval_rg = next(i for i in range(10) if group_of(mix, "eval", i) == "rg")
    right = json.loads(mix.demonstration("eval", eval_rg, "each")[2]["tool_calls"][0]["function"]["arguments"])
    grid = mix.demonstration("eval", 0, "optimal")[2]["tool_calls"][0]["function"]
    chat = ScriptedChat([Reply(tool_calls=[{"id": "c1", "type": "function", "function": grid}]),
                         Reply(tool_calls=[{"id": "c2", "type": "function",
                                            "function": {"name": "answer", "arguments": json.dumps(right)}}])])
    with serve_in_background(build_app(mix, max_concurrent_envs=2)) as env_url, chat.serve() as chat_url:
        outs = []
        for index in (0, eval_rg):
            sid = httpx.post(f"{chat_url}/sessions", trust_env=False).json()["session_id"]
            outs.append(await run(f"{chat_url}/sessions/{sid}", None, {},
                                  {"url": env_url, "split": "eval", "index": index}))
    assert [o["reward"] for o in outs] == [1.0, 1.0]
    assert outs[1]["agentenv_scores"] == {"correct": 1.0}


def test_the_warm_start_draws_each_bundles_teacher_in_proportion(mix):
    assert mix.teachers == ("each", "optimal", "greedy", "label")
    used = Counter()
    for i in range(200):
        messages, _ = demonstration_chats(mix, "train", i, "greedy")[0]
        used[(group_of(mix, "train", i), messages[2]["tool_calls"][0]["function"]["name"])] += 1
    assert used == {("gridsim", "submit_schedule"): 140, ("rg", "answer"): 60}
    # greedy is GridSim's, so its rows take it; rg's rows take rg's own teacher (the dataset's answer).
    i = next(i for i in range(200) if group_of(mix, "train", i) == "gridsim")
    member, split, index = mix.locate("train", i)
    assert mix.demonstration("train", i, "greedy") == member.bundle.demonstration(split, index, "greedy")
    assert mix.demonstration("train", i, "each") == member.bundle.demonstration(split, index, "optimal")
    chosen = load_bundle("mix", bundles={"gridsim": {"weight": 1, "demonstrations": "greedy"}}, train_size=4)
    member, split, index = chosen.locate("train", 0)
    assert chosen.demonstration("train", 0, "each") == member.bundle.demonstration(split, index, "greedy")


def test_the_spec_rebuilds_the_same_mix_without_the_config(mix):
    spec = json.loads(json.dumps(mix.spec()))  # JSON-safe: it crosses into a sandbox
    assert "bundles" not in spec and spec["groups"][1]["spec"]["train_size"] == 40
    again = load_bundle(**spec)
    assert [again.task_info("train", i).task_id for i in range(50)] == \
           [mix.task_info("train", i).task_id for i in range(50)]
    assert mix.data_options() == again.data_options()
    assert mix.data_options() != load_bundle("mix", bundles={"gridsim": 0.5, "rg": {**RG, "weight": 0.5}},
                                             train_size=200).data_options()


composed = compose_config


@pytest.mark.parametrize(("bundles", "named"), [
    ("{gridsimm:1}", r"env.bundles.gridsimm: unknown bundle 'gridsimm'; env=mix takes the env options arith, "),
    ("{gridsim:-0.5}", r"env.bundles.gridsim must be a finite number above 0, got -0.5"),
    ("{gridsim:0}", r"env.bundles.gridsim must be a finite number above 0"),
    ("{gridsim:nan}", r"env.bundles.gridsim must be a finite number above 0, got nan"),
    ("{gridsim:inf}", r"env.bundles.gridsim must be a finite number above 0"),
    ("{gridsim:heavy}", r"env.bundles.gridsim must be a number"),
    ("{}", r"env.bundles is empty"),
    ("null", r"env.bundles is empty"),
    ("{gridsim:{weight:1,prompt_stile:compact}}", r"env.bundles.gridsim.prompt_stile: env option gridsim has no "
                                                  r"setting 'prompt_stile'"),
    ("{gridsim:{prompt_style:compact}}", r"env.bundles.gridsim.weight is not set"),
    ("{gridsim:{weight:1,prompt_style:tiny}}", r"env.bundles.gridsim: .*prompt_style must be one of"),
    ("{g:{env:gridsim,weight:1,server:{port:1}}}", r"env.bundles.g.server: set it on the mix"),
    ("{m:{env:mix,weight:1}}", r"env.bundles.m: a mix cannot hold another mix"),
    ("[{env:gridsim,weight:1},{env:gridsim,weight:2}]", r"env.bundles.gridsim: two groups share the name"),
    ("{gridsim:{weight:1,demonstrations:label}}", r"env.bundles.gridsim.demonstrations=label: bundle gridsim "
                                                  r"offers optimal, greedy"),
])
def test_a_bad_mix_fails_when_the_plan_is_built_naming_the_key(bundles: str, named: str, tmp_path: Path):
    cfg = composed("env=mix", f"env.bundles={bundles}", "trainer.warm_start.enabled=false",
                   f"paths.output_root={tmp_path}")
    with pytest.raises(PlanError, match=named):
        build_plan(cfg, choices={"env": "mix"}, run_dir=tmp_path / "run")


def test_a_mix_and_its_teachers_pass_the_plan(tmp_path: Path):
    cfg = composed("env=mix", "env.bundles={gridsim:0.7,reasoning_gym:0.3}", "env.train_size=100",
                   f"paths.output_root={tmp_path}")  # the warm start's default teacher: optimal
    plan = build_plan(cfg, choices={"env": "mix"}, run_dir=tmp_path / "run")
    assert plan.bundle.splits()["train"] == 100 and "bundle mix" in plan.describe()
    bad = composed("env=mix", "env.bundles={gridsim:0.7,reasoning_gym:0.3}", "trainer.warm_start.teacher=oracle",
                   f"paths.output_root={tmp_path}")
    with pytest.raises(PlanError, match="trainer.warm_start.teacher=oracle: bundle mix offers the teachers each, "
                                        "optimal, greedy, label"):
        build_plan(bad, choices={"env": "mix"}, run_dir=tmp_path / "run")


async def test_a_remote_bundle_joins_the_mix_through_its_url():
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    from agentrl.envs.bundles.openenv_remote.example import GuessEnv
    from agentrl.testing import tool_call

    remote = create_app(GuessEnv, CallToolAction, CallToolObservation, max_concurrent_envs=4)
    with serve_in_background(remote) as guess_url:
        mixed = load_bundle("mix", bundles={"gridsim": 0.5, "guess": {"env": "openenv", "weight": 0.5, "url": guess_url,
                                                                      "train_size": 4, "eval_size": 2}}, train_size=8)
        assert Counter(group_of(mixed, "train", i) for i in range(8)) == {"gridsim": 4, "guess": 4}
        assert [group_of(mixed, "eval", i) for i in range(4)] == ["gridsim", "guess", "gridsim", "guess"]
        # The guess group's eval task 0 resets the remote env with seed 4 (train seeds 0..3): the number is 5.
        chat = ScriptedChat([Reply(tool_calls=[tool_call("guess", {"number": n})]) for n in (3, 7, 5)])
        with serve_in_background(build_app(mixed, max_concurrent_envs=4, tool_timeout=20)) as env_url, \
                chat.serve() as chat_url:
            sid = httpx.post(f"{chat_url}/sessions", trust_env=False).json()["session_id"]
            out = await run(f"{chat_url}/sessions/{sid}", None, {"max_tokens": 64},
                            {"url": env_url, "split": "eval", "index": 1, "max_turns": 8})
    assert out["reward"] == 1.0 and out["agentenv_scores"] == {"reward": 1.0}
    assert mixed.task_info("eval", 1).task_id.startswith("guess/")


def test_agentrl_evals_closing_block_lists_each_bundles_reward(tmp_path: Path):
    from agentrl.eval_run import closing_block

    class NoRun:  # an evaluation whose tracker opened no run: the block names no MLflow run
        run_id = None

    metrics = {"eval/reward": 0.5, "eval/reward_stderr": 0.1, "eval/reward/gridsim": 1.0, "eval/reward/rg": 0.0,
               "eval/reward_1h": 1.0}
    block = closing_block(status="FINISHED", run_dir=tmp_path, tracker=NoRun(), metrics=metrics, subset="all 2 tasks", samples=1,
                          results=None, wall_s=1.0)
    assert "breakdown     reward/gridsim 1.000, reward/rg 0.000, reward_1h 1.000" in block
