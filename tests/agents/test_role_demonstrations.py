"""The role-aware warm start's demonstrations are the prompts the agent sends at play time.

Each pattern's `demonstrations` (thinker_verifier, adversarial, co_evolution) is built from a bundle's
demonstration; a real play of the same task (the real env server, the trainer's row, a scripted chat endpoint
that answers each role with the demonstration's reply) records every request. The prompt part of every
demonstration (the messages before its reply, and the tools) must equal the opening request of that role's
session exactly, and the demonstrated answer must score on the env as the teacher's answer does.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from agentrl.agents.adversarial import AdversarialAgent
from agentrl.agents.base import HttpSessionPool
from agentrl.agents.co_evolution import CoEvolutionAgent
from agentrl.agents.demos import Demonstration, corrupt, near_miss, teacher_answer, with_answer
from agentrl.agents.thinker_verifier import ACCEPT, REJECT, ThinkerVerifierAgent
from agentrl.play.rollout import make_row
from agentrl.rewards import EnvScore
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.testing.plays import rewarded


def prompt(demo: Demonstration) -> list[dict[str, Any]]:
    """The messages a demonstration's reply answers: everything before its first assistant message."""
    first = next(i for i, m in enumerate(demo.messages) if m["role"] == "assistant")
    return demo.messages[:first]


def replied(demo: Demonstration) -> Reply:
    """The demonstration's reply as the scripted endpoint sends it (a tool call or text)."""
    message = next(m for m in demo.messages if m["role"] == "assistant")
    calls = message.get("tool_calls") or []
    if calls:
        fn = calls[0]["function"]
        return Reply(tool_calls=[tool_call(fn["name"], json.loads(fn["arguments"]))])
    return Reply(content=message["content"])


def openings(chat: ScriptedChat) -> dict[str, dict[str, Any]]:
    """The first request of every session, by its system prompt (one session per role here)."""
    out: dict[str, dict[str, Any]] = {}
    for body in chat.requests:
        out.setdefault(body["messages"][0]["content"], body)
    return out


def assert_sent(demo: Demonstration, sent: dict[str, dict[str, Any]]) -> None:
    body = sent[demo.messages[0]["content"]]
    assert body["messages"] == prompt(demo)
    assert body.get("tools") == demo.tools


def task(bundle: Any, index: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    transcript = bundle.demonstration("train", index, bundle.teachers[0])
    return transcript, bundle.episode("train", index).first_turn().tools


@pytest.mark.parametrize("name", ["arith", "gridsim"])
async def test_thinker_verifier_demonstrations_are_its_play_prompts(request, name):
    bundle, url = request.getfixturevalue(f"{name}_bundle"), request.getfixturevalue(f"{name}_url")
    agent = ThinkerVerifierAgent(max_turns=2)
    rng = random.Random(3)
    demos: list[Demonstration] = []
    while len(demos) < 3:  # a task whose demonstrations include the rejected wrong answer
        demos = agent.demonstrations(*task(bundle, 5), rng)
    thinker, accept, reject = demos
    assert (accept.messages[-1]["content"], reject.messages[-1]["content"]) == (ACCEPT, REJECT)
    assert prompt(reject) != prompt(accept)  # the verifier is shown a different (wrong) answer

    chat = ScriptedChat(lambda body, _: replied(thinker if body["messages"][0] == thinker.messages[0] else accept))
    with chat.serve() as chat_url:
        outs = await rewarded(agent.play(HttpSessionPool(chat_url), make_row(bundle, "train", 5, url, {}),
                                         request_kwargs={}), EnvScore())
    sent = openings(chat)
    assert len(sent) == 2
    for demo in (thinker, accept):
        assert_sent(demo, sent)
    # The teacher's answer, proposed and accepted, scores as the teacher does (1: arith's label, GridSim's optimum).
    assert [o.reward for o in outs] == [1.0, 1.0] and outs[0].details["accepted"]


async def test_adversarial_demonstrations_are_its_play_prompts(arith_bundle, arith_url):
    agent = AdversarialAgent()
    solver, proposer, variant_solver = agent.demonstrations(*task(arith_bundle, 0), random.Random(0))
    label = int(re.search(r"-?\d+", variant_solver.messages[-1]["content"]).group())
    assert "<expression>" in proposer.messages[-1]["content"]

    def script(body, _):
        return replied(proposer if "<problem>" in body["messages"][0]["content"] else variant_solver)

    chat = ScriptedChat(script)
    with chat.serve() as chat_url:
        outs = await rewarded(agent.play(HttpSessionPool(chat_url), make_row(arith_bundle, "train", 0, arith_url, {}),
                                         request_kwargs={}), EnvScore())
    sent = openings(chat)
    assert_sent(proposer, sent)
    assert_sent(variant_solver, sent)
    assert prompt(solver)[0] == prompt(variant_solver)[0]  # the row's own problem: the same solver system prompt
    # The proposed variant is valid and its demonstrated answer is its exact value: the solver survives.
    assert outs[0].details["valid"] and outs[0].details["label"] == label
    assert [o.reward for o in outs] == [0.0, 1.0]


@pytest.mark.parametrize("selection", ["answer", "judgment"])
async def test_co_evolution_demonstrations_are_its_play_prompts(gridsim_bundle, gridsim_url, selection):
    agent = CoEvolutionAgent(num_parallel=1, max_turns=1, selection=selection, candidates="before")
    solver, rewriter, selector = agent.demonstrations(*task(gridsim_bundle, 2), random.Random(1))

    def shown(demo: Demonstration) -> Reply:
        """A reply that plays the one candidate the demonstration shows (`name {json arguments}`)."""
        line = demo.messages[1]["content"].split("#### Solution 0\n", 1)[1].split("\n", 1)[0]
        name, arguments = line.split(" ", 1)
        return Reply(tool_calls=[tool_call(name, json.loads(arguments))])

    def script(body, _):
        system = body["messages"][0]["content"]
        return {solver.messages[0]["content"]: lambda: shown(rewriter),
                rewriter.messages[0]["content"]: lambda: shown(selector),
                selector.messages[0]["content"]: lambda: replied(selector)}[system]()

    chat = ScriptedChat(script)
    with chat.serve() as chat_url:
        outs = await rewarded(agent.play(HttpSessionPool(chat_url),
                                         make_row(gridsim_bundle, "train", 2, gridsim_url, {}), request_kwargs={}),
                              EnvScore())
    sent = openings(chat)
    assert len(sent) == 3
    for demo in (solver, rewriter, selector):
        assert_sent(demo, sent)
    assert solver.tools and rewriter.tools and (selector.tools is None) == (selection == "judgment")
    # num_parallel 1: the rewriter is shown a corrupted schedule, the selector the teacher's, which it picks.
    assert outs[-1].details["selected"] == 0 and outs[-1].reward == 1.0 and outs[0].reward < 1.0


def test_answers_are_read_and_replaced_in_either_form(arith_bundle, gridsim_bundle):
    turns = arith_bundle.demonstration("train", 0, "optimal")[2:]
    assert teacher_answer(turns) == arith_bundle.row("train", 0)["label"]
    assert with_answer(turns, "77")[-1]["content"] == "Answer: 77"
    call = gridsim_bundle.demonstration("train", 0, "optimal")[2:]
    schedule = gridsim_bundle.row("train", 0)["optimal_schedule"]
    assert json.loads(teacher_answer(call)) == schedule
    wrongs = {corrupt(teacher_answer(call), random.Random(seed)) for seed in range(8)}
    assert wrongs == {json.dumps([-v for v in reversed(schedule)]), json.dumps([0] * len(schedule))}
    for wrong in wrongs:  # both still feasible (graded), both worse than the teacher's
        result = json.loads(gridsim_bundle.episode("train", 0).call_tool("submit_schedule",
                                                                          {"schedule": json.loads(wrong)}).text)
        assert result["feasible"] and result["reward"] < 1.0
    replaced = with_answer(call, wrong)
    assert len(replaced) == 1 and json.loads(replaced[0]["tool_calls"][0]["function"]["arguments"]) == \
        {"schedule": json.loads(wrong)}


def test_near_misses_are_close_feasible_and_graded_below_the_teacher(arith_bundle, gridsim_bundle):
    rng, worse = random.Random(0), 0
    for index in range(40):
        schedule = gridsim_bundle.row("train", index)["optimal_schedule"]
        near = near_miss(json.dumps(schedule), rng)
        if near is None:  # only an idle day has no local edit
            assert not any(schedule)
            continue
        moved = json.loads(near)
        assert moved != schedule and len(moved) == len(schedule)
        assert sum(a != b for a, b in zip(moved, schedule, strict=True)) <= 4  # two edits of two hours at most
        result = json.loads(gridsim_bundle.episode("train", index).call_tool("submit_schedule",
                                                                             {"schedule": moved}).text)
        assert result["feasible"] and result["reward"] <= 1.0
        worse += result["reward"] < 1.0
    assert worse >= 30  # a near miss is a mistake, not another optimum, on most days
    assert near_miss("[0, 0, 0]", rng) is None
    label = int(arith_bundle.row("train", 0)["label"])
    assert {int(near_miss(str(label), random.Random(s))) - label for s in range(20)} == {-2, -1, 1, 2}


def candidates_shown(demo: Demonstration) -> list[list[int]]:
    """The schedules a rewriter's or selector's demonstration shows (`#### Solution i` then `name {json}`)."""
    blocks = demo.messages[1]["content"].split("#### Solution ")[1:]
    return [json.loads(b.split("\n", 1)[1].split("\n", 1)[0].split(" ", 1)[1])["schedule"] for b in blocks]


@pytest.mark.parametrize("kind", ["far", "near"])
def test_co_evolution_warm_start_shows_far_or_near_wrong_candidates(gridsim_bundle, kind):
    agent = CoEvolutionAgent(num_parallel=4, max_turns=1, selection="answer", candidates="before",
                             demo_candidates=kind)
    rng, wrong = random.Random(2), []
    for index in range(12):
        schedule = gridsim_bundle.row("train", index)["optimal_schedule"]
        _, rewriter, selector = agent.demonstrations(*task(gridsim_bundle, index), rng)
        assert json.loads(teacher_answer(rewriter.messages[2:])) == schedule  # both roles still answer the teacher's
        assert schedule in candidates_shown(selector)
        wrong += [(schedule, c) for demo in (rewriter, selector) for c in candidates_shown(demo) if c != schedule]
    far = [c for s, c in wrong if c in ([-v for v in reversed(s)], [0] * len(s))]
    close = [c for s, c in wrong if sum(a != b for a, b in zip(s, c, strict=True)) <= 4]
    assert len(wrong) > 20
    if kind == "far":
        assert len(far) == len(wrong) and len(close) < len(wrong) / 2
    else:  # (a near miss of a one-hour battery's one cycle can be idle: dropped)
        assert len(close) == len(wrong) and len(far) < len(wrong) / 4
    # A warm start of near candidates is its own folder; the default keeps the folders made before the option.
    assert ("demo_candidates" in agent.demonstration_options()) == (kind == "near")


def test_co_evolution_refuses_an_unknown_demo_candidates():
    with pytest.raises(ValueError, match="agent.demo_candidates must be far or near, not 'close'"):
        CoEvolutionAgent(demo_candidates="close")
