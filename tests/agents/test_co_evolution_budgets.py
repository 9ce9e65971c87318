"""Co-evolution's budgets, as in Miles: `max_context_tokens` bounds each role's whole conversation and
`max_response_tokens` one reply; a rollout over either is flagged (`over_budget`, `truncated`), never cut
silently, and its group is dropped from training. Also `selection: answer` (the selector restates its pick).

Real env server (arith) and the scripted endpoint, whose token counts are exact (words and punctuation).
"""

from __future__ import annotations

import pytest

from agentrl.agents.base import HttpSessionPool
from agentrl.agents.co_evolution import CoEvolutionAgent, restated
from agentrl.agents.record import Failure, Rollout
from agentrl.group_filter import FAILED, group_drop_reason
from agentrl.play.evaluate import outcome_of, role_metrics
from agentrl.rewards import Asymmetric
from agentrl.testing import Reply, ScriptedChat
from agentrl.testing.plays import rewarded

LABEL = "19"
N = 3


def row(url: str) -> dict:
    return {"messages": [{"role": "system", "content": "You are careful."},
                         {"role": "user", "content": "What is 11 × 2 − 3?"}],
            "metadata": {"url": url, "split": "train", "index": 0}}


def role_of(body: dict) -> str:
    system = body["messages"][0]["content"]
    for marker, role in (("Pick the best", "selector"), ("improved solution", "rewriter"), ("Solve the", "solver")):
        if marker in system:
            return role
    raise AssertionError(system)


async def test_rewriters_over_the_context_budget_are_flagged_before_any_call(arith_url):
    """Each solver fits; the rewriters' prompt holds all 3 long solver answers and does not: they are flagged
    over_budget without a model call, the play exits early, and the rewriter group is dropped."""
    padding = "I checked every step of this carefully and twice. " * 20  # ~1,000 characters per answer
    chat = ScriptedChat(lambda body, sid: Reply(content=f"{padding}\nAnswer: {LABEL}"))
    agent = CoEvolutionAgent(num_parallel=N, max_turns=1, max_context_tokens=400, max_response_tokens=300)
    with chat.serve() as url:
        outs = await rewarded(agent.play(HttpSessionPool(url), row(arith_url), request_kwargs={}), Asymmetric())
    assert [role_of(b) for b in chat.requests] == ["solver"] * N  # no rewriter or selector was asked
    solvers, rewriters = outs[:N], outs[N:]
    assert [o.role for o in rewriters] == ["rewriter"] * N
    assert all(o.failure is None and o.scores == {"correct": 1.0} for o in solvers)
    assert all(o.failure == Failure.OVER_BUDGET and o.turns == 0 and o.reward == 0.0 for o in rewriters)
    assert all(o.early_exit and o.weight == 0.8 for o in outs)  # no selected answer: weighted as incorrect
    assert group_drop_reason(rewriters) == FAILED and group_drop_reason(solvers) != FAILED
    assert outcome_of(outs).score == 0.0  # eval: a play that selected nothing scores 0


async def test_every_turn_asks_for_at_most_max_response_tokens_and_a_cut_reply_is_flagged(arith_url):
    """Solvers are cut off (finish_reason length): flagged truncated, 0, and the play ends before a rewrite."""
    chat = ScriptedChat(lambda body, sid: Reply(content=f"Answer: {LABEL}", finish_reason="length"))
    agent = CoEvolutionAgent(num_parallel=N, max_turns=2, max_response_tokens=7)
    with chat.serve() as url:
        outs = await rewarded(agent.play(HttpSessionPool(url), row(arith_url), request_kwargs={"max_tokens": 50}),
                              Asymmetric())
    assert [b["max_tokens"] for b in chat.requests] == [7] * N  # the per-turn budget caps the request's own
    assert [o.failure for o in outs] == [Failure.TRUNCATED] * N and all(o.reward == 0.0 for o in outs)
    assert len(chat.requests) == N  # a truncated reply is not continued by another turn


async def test_a_cut_off_judgment_is_flagged_not_parsed(arith_url):
    """The selector's reply holds a valid `Judgment: 0` but hit max_response_tokens: flagged, no outcome."""
    def script(body, sid):
        if role_of(body) == "selector":
            return Reply(content="Judgment: 0 because", finish_reason="length")
        return Reply(content=f"Answer: {LABEL}")

    with ScriptedChat(script).serve() as url:
        outs = await rewarded(CoEvolutionAgent(num_parallel=N, max_turns=1, max_response_tokens=5).play(
            HttpSessionPool(url), row(arith_url), request_kwargs={}), Asymmetric())
    judge = outs[-1]
    assert judge.role == "selector" and judge.failure == Failure.TRUNCATED and judge.details["selected"] is None
    assert judge.scores is None and all(o.weight == 0.8 for o in outs)  # an early exit, although all were right
    assert outs[0].reward == pytest.approx(0.8)


async def test_the_selector_over_the_context_budget_is_flagged(arith_url):
    """Solvers and rewriters fit; the selector's prompt (3 rewrites) does not."""
    padding = "step " * 60

    def script(body, sid):
        return Reply(content=f"{padding}Answer: {LABEL}") if role_of(body) == "rewriter" else Reply(content=f"Answer: {LABEL}")

    chat = ScriptedChat(script)
    agent = CoEvolutionAgent(num_parallel=N, max_turns=1, max_context_tokens=250, max_response_tokens=100)
    with chat.serve() as url:
        outs = await rewarded(agent.play(HttpSessionPool(url), row(arith_url), request_kwargs={}), Asymmetric())
    assert "selector" not in [role_of(b) for b in chat.requests]
    assert outs[-1].role == "selector" and outs[-1].failure == Failure.OVER_BUDGET
    assert all(o.failure is None for o in outs[:-1]) and all(o.early_exit for o in outs)


async def test_selection_by_answer_is_graded_by_the_env(arith_url):
    """`selection: answer`: the selector plays the episode seeing the rewrites; the env grades what it answers,
    eval scores that answer unweighted, and `selected` names the rewrite it restated."""
    count = {"rewriter": 0}

    def script(body, sid):
        role = role_of(body)
        if role == "rewriter":
            count["rewriter"] += 1
            return Reply(content=f"\\boxed{{{LABEL if count['rewriter'] == 2 else 4}}}")
        if role == "selector":
            assert body["messages"][1]["content"].count("#### Solution") == N
            return Reply(content=f"The second one.\nAnswer: {LABEL}")
        return Reply(content="Answer: 4")

    agent = CoEvolutionAgent(num_parallel=N, max_turns=1, selection="answer",
                             roles=[{"name": "selector", "prompt": "Pick the best rewritten solution; restate it."}])
    with ScriptedChat(script).serve() as url:
        outs = await rewarded(agent.play(HttpSessionPool(url), row(arith_url), request_kwargs={}), Asymmetric())
    judge = outs[-1]
    rewrites = [o for o in outs if o.role == "rewriter"]
    assert judge.scores == {"correct": 1.0} and judge.reward == pytest.approx(1.2)
    assert rewrites[judge.details["selected"]].answer == f"\\boxed{{{LABEL}}}"
    assert outcome_of(outs).score == 1.0 and outcome_of(outs).role == "selector"
    by_role = role_metrics([outs], "eval")
    assert by_role["eval/reward_solver"] == 0.0 and by_role["eval/reward_rewriter"] == pytest.approx(1 / N)
    assert by_role["eval/reward_selector"] == 1.0


def test_restated_matches_final_answers_and_tool_calls():
    rewrites = [Rollout(answer="Answer: 7"), Rollout(answer='submit_schedule {"schedule": [1, 0]}')]
    assert restated("so \\boxed{7}", rewrites) == 0
    assert restated('submit_schedule {"schedule":[1,0]}', rewrites) == 1
    assert restated("Answer: 8", rewrites) is None and restated("", rewrites) is None
    with pytest.raises(ValueError, match="selection"):
        CoEvolutionAgent(selection="vote")


def test_tool_calling_eval_outcome_is_its_one_rollout():
    only = Rollout(role="agent", score=0.7, reward=0.7)
    assert outcome_of([only]) is only and role_metrics([[only]], "eval") == {}


async def test_each_session_of_a_play_samples_with_its_own_seed(arith_url):
    """A play's seed is shared by its sessions: the solvers (same prompt) must not be copies of one sample."""
    def script(body, sid):
        return Reply(content="Judgment: 0") if role_of(body) == "selector" else Reply(content=f"Answer: {LABEL}")

    seeds = []
    for _ in range(2):
        chat = ScriptedChat(script)
        with chat.serve() as url:
            await rewarded(CoEvolutionAgent(num_parallel=N, max_turns=1).play(
                HttpSessionPool(url), row(arith_url), request_kwargs={"seed": 42, "temperature": 1.0}), Asymmetric())
        seeds.append(sorted((role_of(b), b["seed"]) for b in chat.requests))
    assert len({s for _, s in seeds[0]}) == 2 * N + 1  # every session its own seed
    assert seeds[0] == seeds[1]  # and the same ones again: plays stay reproducible


async def test_candidates_before_the_task(arith_url):
    """`candidates: before`: the rewriter's and selector's prompts end with the task, as the solver's does."""
    chat = ScriptedChat(lambda body, sid: Reply(content="Judgment: 0") if role_of(body) == "selector"
                        else Reply(content=f"Answer: {LABEL}"))
    with chat.serve() as url:
        await rewarded(CoEvolutionAgent(num_parallel=N, max_turns=1, candidates="before").play(
            HttpSessionPool(url), row(arith_url), request_kwargs={}), Asymmetric())
    users = {role_of(b): b["messages"][1]["content"] for b in chat.requests}
    assert users["rewriter"].startswith("### Candidate solutions") and users["rewriter"].endswith("11 × 2 − 3?")
    assert users["selector"].startswith("### Rewritten solutions") and users["solver"] == "What is 11 × 2 − 3?"
    with pytest.raises(ValueError, match="candidates"):
        CoEvolutionAgent(candidates="middle")
