"""Eval of a judged play (co-evolution): a task's eval reward is the selected answer's score, unweighted, read
from `Rollout.score` (no weight is divided back out), and "judged" / "holds the outcome" are typed fields of the
record, never `details[...]` keys.

Real env server (GridSim, whose grades are partial), the scripted endpoint for every role, the trainer's runner
and `evaluate` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.agents.base import HttpSessionPool
from agentrl.agents.co_evolution import ROLES, CoEvolutionAgent
from agentrl.config.sampling import Sampling
from agentrl.play.eval_subset import eval_indices
from agentrl.play.evaluate import evaluate
from agentrl.play.rollout import RolloutRunner, make_row
from agentrl.rewards import Asymmetric
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.testing.plays import rewarded

REPO = Path(__file__).resolve().parents[2]
N = 2
# A selected answer that is not right trains on nothing (x 0); eval must still report its grade.
ZERO_WHEN_WRONG = Asymmetric(correct_weight=1.2, incorrect_weight=0.0)


def role_of(body: dict) -> str:
    system = body["messages"][0]["content"]
    for marker, role in (("Pick the best", "selector"), ("improved solution", "rewriter"), ("Solve the", "solver")):
        if marker in system:
            return role
    raise AssertionError(system)


def scripted(bundle, url: str, rewrites: dict[int, str]) -> ScriptedChat:
    """Every solver submits task i's greedy schedule; every rewriter the schedule `rewrites[i]` names; the
    selector picks rewrite 0."""
    tasks = {i: make_row(bundle, "eval", i, url, {})["messages"][1]["content"] for i in rewrites}

    def script(body, sid):
        role = role_of(body)
        if role == "selector":
            return Reply(content="Judgment: 0")
        i = next(i for i, task in tasks.items() if body["messages"][1]["content"].startswith(task))
        kind = rewrites[i] if role == "rewriter" else "greedy_schedule"
        return Reply(tool_calls=[tool_call("submit_schedule", {"schedule": bundle.row("eval", i)[kind]})])

    return ScriptedChat(script)


def test_eval_reports_the_selected_answers_score_unweighted(gridsim_bundle, gridsim_url):
    """The first eval task's selected rewrite is optimal (grade 1: weighted x1.2 in training), the second's greedy
    (a partial grade: x0 in training). Eval's reward is the mean of the two grades, and each role's mean score."""
    # eval with limit=2 plays a stratified subset of the split (issue 54), not its first 2 tasks
    first, second = eval_indices(gridsim_bundle, "eval", 2)
    chat = scripted(gridsim_bundle, gridsim_url, {first: "optimal_schedule", second: "greedy_schedule"})
    with chat.serve() as chat_url:
        # External endpoints: every role plays the scripted chat, and nothing is read back as a sample.
        runner = RolloutRunner(CoEvolutionAgent(num_parallel=N, max_turns=2), chat_url, reward=ZERO_WHEN_WRONG,
                               external={role: chat_url for role in ROLES})
        services = SimpleNamespace(env_url=gridsim_url, env_settings={}, runner=runner)
        metrics, played = evaluate(services, gridsim_bundle, "eval", limit=2, quiet=True,
                                   sampling=Sampling(temperature=1.0, top_p=1.0, top_k=0))
    greedy = [gridsim_bundle.row("eval", i)["greedy_schedule"] for i in (first, second)]
    assert greedy[0] != gridsim_bundle.row("eval", first)["optimal_schedule"]
    right, partial = played
    grade = partial.scores["grade"]  # task 1's greedy schedule, as GridSim graded it
    assert 0.0 < grade < 1.0 and right.scores == {"grade": 1.0}
    assert metrics["eval/reward"] == pytest.approx((1.0 + grade) / 2) and metrics["eval/zero_share"] == 0.0
    assert metrics["eval/reward_selector"] == pytest.approx((1.0 + grade) / 2)
    assert metrics["eval/reward_rewriter"] == pytest.approx((1.0 + grade) / 2)
    assert 0.0 < metrics["eval/reward_solver"] < 1.0  # the solvers' own greedy grades, unweighted
    assert (right.role, right.score, right.weight, right.reward) == ("selector", 1.0, 1.2, pytest.approx(1.2))
    assert (partial.role, partial.score, partial.weight, partial.reward) == ("selector", grade, 0.0, 0.0)


async def test_judged_and_the_outcome_are_typed_fields_not_details_keys(gridsim_bundle, gridsim_url):
    chat = scripted(gridsim_bundle, gridsim_url, {0: "optimal_schedule"})
    row = make_row(gridsim_bundle, "eval", 0, gridsim_url, {})
    with chat.serve() as chat_url:
        outs = await rewarded(CoEvolutionAgent(num_parallel=N, max_turns=2).play(
            HttpSessionPool(chat_url), row, request_kwargs={}), ZERO_WHEN_WRONG)
    assert [o.role for o in outs] == ["solver"] * N + ["rewriter"] * N + ["selector"]
    assert all(o.judged for o in outs) and [o.holds_outcome for o in outs] == [False] * 2 * N + [True]
    assert outs[-1].details == {"selected": 0}
    assert not any({"judged", "outcome"} & set(o.details) for o in outs)


DETAILS_KEYS = {"judged", "outcome"}


def details_key_uses(tree: ast.AST) -> list[int]:
    """Lines where `<x>.details` is indexed, read, or updated with the key "judged" or "outcome"."""
    def is_details(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "details"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_details(node.value) and isinstance(node.slice, ast.Constant) \
                and node.slice.value in DETAILS_KEYS:
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_details(node.func.value):
            keys = {a.value for a in node.args[:1] if isinstance(a, ast.Constant)} | {k.arg for k in node.keywords}
            if keys & DETAILS_KEYS:
                lines.append(node.lineno)
    return lines


def test_no_code_reads_or_writes_a_judged_or_outcome_details_key():
    found = {str(path.relative_to(REPO)): lines for root in ("agentrl", "benchmarks")
             for path in sorted((REPO / root).rglob("*.py"))
             if (lines := details_key_uses(ast.parse(path.read_text(), str(path))))}
    assert found == {}, f"details['judged'/'outcome'] is used at {found}: use Rollout.judged / holds_outcome"
    sample = ast.parse('r.details["judged"] = True\njudge.details.update(selected=0, outcome=True)\n'
                       'r.details.get("outcome")\nr.details["selected"] = 1\n')
    assert details_key_uses(sample) == [1, 2, 3]  # the scan sees each form the old code used
