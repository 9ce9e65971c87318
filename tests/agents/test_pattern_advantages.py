"""GRPO advantages of every agent pattern's real rollouts, against values computed by hand.

Each pattern plays against the real env server (arith) and the scripted endpoint, the reward group rewards the
plays, and every rollout gets the group key the trainer's runner gives it: (split, index, role). Groups then
differ in size: co-evolution's 5 solvers, 5 rewriters and 1 selector; adversarial's proposers and the fewer
solvers left after an early exit. `items_from` (the learner's entry point) must give the hand-computed values.
"""

from __future__ import annotations

import math

import pytest

from agentrl.agents.adversarial import AdversarialAgent
from agentrl.agents.base import HttpSessionPool
from agentrl.agents.co_evolution import CoEvolutionAgent
from agentrl.agents.record import Rollout
from agentrl.agents.thinker_verifier import ThinkerVerifierAgent
from agentrl.inference.sessions.samples import Sample
from agentrl.rewards import Asymmetric, EnvScore
from agentrl.testing import Reply, ScriptedChat
from agentrl.testing.plays import rewarded
from agentrl.trainers.grpo.grpo_math import group_advantages
from agentrl.trainers.grpo.learner import items_from

LABEL = "19"  # arith train row 0: "What is 11 × 2 − 3?"


def row(url: str) -> dict:
    return {"messages": [{"role": "system", "content": "You are careful."},
                         {"role": "user", "content": "What is 11 × 2 − 3?"}],
            "metadata": {"url": url, "split": "train", "index": 0}}


def as_trained(rollouts: list[Rollout]) -> list[Rollout]:
    """What the runner adds: the (split, index, role) group and a recorded sample with model tokens."""
    for r in rollouts:
        r.group = ("train", 0, r.role)
        r.sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], r.reward)
    return rollouts


def advantages(rollouts: list[Rollout]) -> list[float]:
    items, adv = items_from(rollouts)
    assert [i.advantage for i in items] == pytest.approx(adv.tolist())  # every sample trains (none frozen)
    assert adv.tolist() == pytest.approx(group_advantages([r.reward for r in rollouts],
                                                          [r.group for r in rollouts]).tolist())
    return adv.tolist()


def role_of(body: dict) -> str:
    system = body["messages"][0]["content"]
    for marker, role in (("Pick the best", "selector"), ("improved solution", "rewriter"), ("Solve the", "solver")):
        if marker in system:
            return role
    raise AssertionError(system)


async def test_co_evolution_5_solvers_5_rewriters_1_selector(arith_url):
    """One play: 3 of 5 solvers right, 1 of 5 rewriters right, the selector picks it (x1.2)."""
    count = {"solver": 0, "rewriter": 0}

    def script(body, session_id):
        role = role_of(body)
        if role == "selector":
            block = body["messages"][1]["content"].split("### Rewritten solutions")[1]
            shown = [p.split("\n", 1)[1].strip() for p in block.split("#### Solution ")[1:]]
            return Reply(content=f"Judgment: {shown.index(f'Answer: {LABEL}')}")
        count[role] += 1
        right = count[role] <= (3 if role == "solver" else 1)
        return Reply(content=f"Answer: {LABEL if right else 7}")

    with ScriptedChat(script).serve() as chat_url:
        outs = as_trained(await rewarded(CoEvolutionAgent(num_parallel=5, max_turns=1).play(
            HttpSessionPool(chat_url), row(arith_url), request_kwargs={}), Asymmetric()))
    assert [o.role for o in outs].count("solver") == 5 and outs[-1].role == "selector"
    adv = advantages(outs)
    right = [o.reward > 0 for o in outs]
    # Solvers, p = 3/5 right: sqrt((1-p)/p) = sqrt(2/3) and -sqrt(p/(1-p)) = -sqrt(3/2) (the 1.2 cancels).
    for a, ok in zip(adv[:5], right[:5], strict=True):
        assert a == pytest.approx(math.sqrt(2 / 3) if ok else -math.sqrt(3 / 2), abs=1e-5)
    # Rewriters, 1 of 5 right: +2 and -1/2.
    for a, ok in zip(adv[5:10], right[5:10], strict=True):
        assert a == pytest.approx(2.0 if ok else -0.5, abs=1e-5)
    assert adv[10] == 0.0  # a lone selector has no baseline


async def test_co_evolution_two_plays_weighting_moves_the_solvers_advantages(arith_url):
    """Two plays of one row: the same right solver earns more in the play whose selected answer is right.

    Solvers: 3 of 5 right in both plays; play A's selector picks a right rewrite (x1.2), play B's a wrong one
    (x0.8). The solver group of 10 holds 1.2 x3, 0.8 x3, 0 x4: mean 0.6, population std sqrt(0.264).
    """
    count: dict[str, int] = {}
    selections = iter([True, False])

    def script(body, session_id):
        role = role_of(body)
        if role == "selector":
            block = body["messages"][1]["content"].split("### Rewritten solutions")[1]
            shown = [p.split("\n", 1)[1].strip() for p in block.split("#### Solution ")[1:]]
            want = f"Answer: {LABEL}" if next(selections) else "Answer: 7"
            return Reply(content=f"Judgment: {shown.index(want)}")
        count[role] = count.get(role, 0) + 1
        right = (count[role] - 1) % 5 < (3 if role == "solver" else 1)
        return Reply(content=f"Answer: {LABEL if right else 7}")

    agent = CoEvolutionAgent(num_parallel=5, max_turns=1)
    outs: list[Rollout] = []
    with ScriptedChat(script).serve() as chat_url:
        for _ in range(2):  # one play after the other, so each play's 5 solvers are 3 right + 2 wrong
            outs += await rewarded(agent.play(HttpSessionPool(chat_url), row(arith_url), request_kwargs={}),
                                   Asymmetric())
    adv = advantages(as_trained(outs))
    std = math.sqrt(0.264)
    for o, a in zip(outs, adv, strict=True):
        if o.role == "solver":
            expected = {1.2: 0.6 / std, 0.8: 0.2 / std, 0.0: -0.6 / std}[round(o.reward, 6)]
            assert a == pytest.approx(expected, abs=1e-5)
    selectors = [(o.reward, a) for o, a in zip(outs, adv, strict=True) if o.role == "selector"]
    assert selectors == [(pytest.approx(1.2), pytest.approx(1.0, abs=1e-5)), (0.0, pytest.approx(-1.0, abs=1e-5))]


async def test_thinker_verifier_three_plays(arith_url):
    """Plays: accepted and right (1), accepted and wrong (0), never accepted (0, an early exit)."""
    modes = iter([("right", True), ("wrong", True), ("right", False)])
    mode = {}

    def script(body, session_id):
        if "Check the proposal" in body["messages"][0]["content"]:
            return Reply(content="ACCEPT" if mode["accept"] else "Wrong, try again.")
        return Reply(content=f"<final_answer>{LABEL if mode['answer'] == 'right' else 5}</final_answer>")

    outs: list[Rollout] = []
    with ScriptedChat(script).serve() as chat_url:
        for answer, accept in modes:
            mode.update(answer=answer, accept=accept)
            outs += await rewarded(ThinkerVerifierAgent(max_turns=2).play(
                HttpSessionPool(chat_url), row(arith_url), request_kwargs={}), EnvScore())
    assert [o.reward for o in outs] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0] and outs[-1].early_exit
    adv = advantages(as_trained(outs))
    # Each role's group of 3 holds [1, 0, 0]: +sqrt(2) and -1/sqrt(2).
    expected = [math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)]
    assert adv[0::2] == pytest.approx(expected, abs=1e-5) and adv[1::2] == pytest.approx(expected, abs=1e-5)


async def test_adversarial_early_exit_leaves_a_smaller_solver_group(arith_url):
    """Plays: the solver survives, the solver breaks, an invalid variant (no solver): groups of 3 and 2."""
    variants = iter(["<problem>What is 2 + 3?</problem><expression>2 + 3</expression>",
                     "<problem>What is 2 + 3?</problem><expression>2 + 3</expression>",
                     "<problem>Half of 7?</problem><expression>7 / 2</expression>"])
    answers = iter(["Answer: 5", "Answer: 6"])

    def script(body, session_id):
        if "<problem>" in body["messages"][0]["content"]:
            return Reply(content=next(variants))
        return Reply(content=next(answers))

    outs: list[Rollout] = []
    with ScriptedChat(script).serve() as chat_url:
        for _ in range(3):
            outs += await rewarded(AdversarialAgent().play(HttpSessionPool(chat_url), row(arith_url),
                                                           request_kwargs={}), EnvScore())
    assert [(o.role, o.reward) for o in outs] == [("proposer", 0.0), ("solver", 1.0), ("proposer", 1.0),
                                                  ("solver", 0.0), ("proposer", 0.0)]
    assert outs[-1].early_exit
    adv = advantages(as_trained(outs))
    s2 = math.sqrt(2)
    assert adv == pytest.approx([-1 / s2, 1.0, s2, -1.0, -1 / s2], abs=1e-5)


@pytest.mark.parametrize("verdict, accepted, reward", [(f"Answer: {LABEL}", True, 1.0), ("Answer: 5", False, 0.0)])
async def test_thinker_verifier_accepts_on_agreement(arith_url, verdict, accepted, reward):
    """`accept: agreement`: a verifier that re-solves to the thinker's `Answer:` accepts it (and graded right)."""
    def script(body, session_id):
        if "Check the proposal" in body["messages"][0]["content"]:
            return Reply(content=verdict)
        return Reply(content=f"Answer: {LABEL}")

    with ScriptedChat(script).serve() as chat_url:
        outs = await rewarded(ThinkerVerifierAgent(max_turns=2, accept="agreement").play(
            HttpSessionPool(chat_url), row(arith_url), request_kwargs={}), EnvScore())
    assert outs[0].details["accepted"] is accepted and [o.reward for o in outs] == [reward, reward]
    with pytest.raises(ValueError, match="accept"):
        ThinkerVerifierAgent(accept="vote")
