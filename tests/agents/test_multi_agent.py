"""Co-evolution, thinker-verifier and adversarial patterns against the env server and the scripted endpoint."""

from __future__ import annotations

import pytest

from agentrl.agents.adversarial import AdversarialAgent, InvalidProblem, evaluate, parse_variant
from agentrl.agents.base import HttpSessionPool, multi_agent_metrics
from agentrl.agents.co_evolution import CoEvolutionAgent, parse_judgment
from agentrl.agents.thinker_verifier import ThinkerVerifierAgent, accepts
from agentrl.rewards import Asymmetric, EnvScore
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.testing.plays import rewarded

N = 3


def role_of(body) -> str:
    system = body["messages"][0]["content"]
    for marker, role in (("Pick the best", "selector"), ("improved solution", "rewriter"), ("Solve the", "solver")):
        if marker in system:
            return role
    raise AssertionError(f"no role in {system!r}")


def arith_row(url: str, index: int = 0) -> dict:
    return {"messages": [{"role": "system", "content": "You are careful."},
                         {"role": "user", "content": "What is 11 × 2 − 3?"}],
            "metadata": {"url": url, "split": "train", "index": index}}


@pytest.mark.parametrize("pick_correct, weight", [(True, 1.2), (False, 0.8)])
async def test_co_evolution_on_arith(arith_bundle, arith_url, pick_correct, weight):
    label = arith_bundle.row("train", 0)["label"]
    rewrites, picked = {"n": 0}, {}

    def script(body, session_id):
        role = role_of(body)
        if role == "solver":
            return Reply(content=f"Answer: {label}")
        if role == "rewriter":
            assert body["messages"][1]["content"].count("#### Solution") == N
            rewrites["n"] += 1  # rewriter 0 is right, the others wrong
            return Reply(content=f"\\boxed{{{label if rewrites['n'] == 1 else 0}}}")
        block = body["messages"][1]["content"].split("### Rewritten solutions")[1]
        shown = [part.split("\n", 1)[1].strip() for part in block.split("#### Solution ")[1:]]
        assert len(shown) == N
        picked["i"] = shown.index(f"\\boxed{{{label}}}") if pick_correct else shown.index("\\boxed{0}")
        return Reply(content=f"I compared them.\nJudgment: {picked['i']}")

    agent = CoEvolutionAgent(num_parallel=N, max_turns=2)
    with ScriptedChat(script).serve() as chat_url:
        pool = HttpSessionPool(chat_url)
        outs = await rewarded(agent.play(pool, arith_row(arith_url), request_kwargs={}), Asymmetric())
    assert len(outs) == 2 * N + 1
    assert [o.role for o in outs] == ["solver"] * N + ["rewriter"] * N + ["selector"]
    assert len({o.base_url for o in outs}) == 2 * N + 1 and [r for r, _ in pool.opened].count("selector") == 1
    selected = 1.0 if pick_correct else 0.0
    assert [o.reward for o in outs[:N]] == pytest.approx([1.0 * weight] * N)
    assert sorted(o.reward for o in outs[N:2 * N]) == pytest.approx(sorted([weight] + [0.0] * (N - 1)))
    assert outs[-1].reward == pytest.approx(selected * weight)
    assert all(o.weight == weight for o in outs)
    assert outs[-1].details["selected"] == picked["i"]
    metrics = multi_agent_metrics(outs)
    assert metrics["reward/selector"] == pytest.approx(selected * weight)
    assert metrics["multi_agent/early_termination_rate"] == 0.0 and metrics["loss_mask/role_split"] == 1.0


async def test_co_evolution_on_gridsim_grades_schedules(gridsim_bundle, gridsim_url):
    row = gridsim_bundle.row("eval", 4)
    best, greedy = row["optimal_schedule"], row["greedy_schedule"]

    def script(body, session_id):
        role = role_of(body)
        if role == "selector":
            return Reply(content="Judgment: 0")
        if role == "rewriter":
            assert "submit_schedule" in body["messages"][1]["content"]
        return Reply(tool_calls=[tool_call("submit_schedule", {"schedule": best if role == "rewriter" else greedy})])

    roles = [{"name": "solver", "prompt": "Solve the task."},
             {"name": "rewriter", "prompt": "Write one improved solution.", "frozen": True},
             {"name": "selector", "prompt": "Pick the best rewritten solution. Reply 'Judgment: IDX'."}]
    agent = CoEvolutionAgent(num_parallel=2, roles=roles)
    task = {"messages": [{"role": "system", "content": "Battery."}, {"role": "user", "content": "Prices ..."}],
            "metadata": {"url": gridsim_url, "split": "eval", "index": 4}}
    with ScriptedChat(script).serve() as chat_url:
        outs = await rewarded(agent.play(HttpSessionPool(chat_url), task, request_kwargs={}), Asymmetric())
    greedy_grade = outs[0].scores["grade"]
    assert 0 < greedy_grade < 1
    assert [o.reward for o in outs] == pytest.approx([greedy_grade * 1.2] * 2 + [1.2] * 3)
    assert [o.frozen for o in outs] == [False, False, True, True, False]
    assert 0 < multi_agent_metrics(outs)["loss_mask/role_split"] < 1


async def test_co_evolution_early_exit_weights_as_incorrect(arith_url):
    with ScriptedChat([], default=Reply(content="")).serve() as chat_url:
        outs = await rewarded(CoEvolutionAgent(num_parallel=N, max_turns=1).play(HttpSessionPool(chat_url), arith_row(arith_url), request_kwargs={}), Asymmetric())
    assert [o.role for o in outs] == ["solver"] * N
    assert all(o.early_exit and o.weight == 0.8 for o in outs)
    assert multi_agent_metrics(outs)["multi_agent/early_termination_rate"] == 1.0


def test_judgment_parsing_and_roles_config():
    assert parse_judgment("x Judgment: 1\n...Judgment: 2", 3) == 2
    assert parse_judgment("Judgment: 3", 3) is None and parse_judgment("none", 3) is None
    with pytest.raises(ValueError, match="needs a name"):
        CoEvolutionAgent(roles=[{"prompt": "x"}])
    custom = CoEvolutionAgent(roles=[{"name": "selector", "prompt": "Choose.", "model": "http://other:1"}])
    assert custom.roles["selector"].prompt == "Choose." and custom.roles["solver"].prompt.startswith("Solve")
    with pytest.raises(ValueError, match="num_parallel"):
        CoEvolutionAgent(num_parallel=0)


async def test_thinker_verifier_shared_reward(arith_bundle, arith_url):
    label = arith_bundle.row("train", 0)["label"]
    verdicts = iter(["The sum is wrong.", "ACCEPT"])

    def script(body, session_id):
        if "Check the proposal" in body["messages"][0]["content"]:
            return Reply(content=next(verdicts))
        tries = sum(m["role"] == "assistant" for m in body["messages"])
        return Reply(content=f"<final_answer>{label if tries else 5}</final_answer>")

    with ScriptedChat(script).serve() as chat_url:
        outs = await rewarded(ThinkerVerifierAgent(max_turns=6).play(HttpSessionPool(chat_url), arith_row(arith_url), request_kwargs={}), EnvScore())
    assert [o.role for o in outs] == ["thinker", "verifier"] and [o.reward for o in outs] == [1.0, 1.0]
    assert outs[0].details["conversation_turns"] == 4 and outs[0].details["accepted"]
    assert outs[0].turns == 2 and outs[1].turns == 2


async def test_thinker_verifier_never_accepting_scores_zero(arith_bundle, arith_url):
    label = arith_bundle.row("train", 0)["label"]

    def script(body, session_id):
        if "Check the proposal" in body["messages"][0]["content"]:
            return Reply(content="No, I do not accept it.")
        return Reply(content=f"<final_answer>{label}</final_answer>")

    chat = ScriptedChat(script)
    with chat.serve() as chat_url:
        outs = await rewarded(ThinkerVerifierAgent(max_turns=3).play(HttpSessionPool(chat_url), arith_row(arith_url), request_kwargs={}), EnvScore())
    assert len(chat.requests) == 3 and [o.reward for o in outs] == [0.0, 0.0]
    assert outs[0].early_exit and not accepts("I do NOT ACCEPT this") and accepts("ACCEPT")


@pytest.mark.parametrize("solver_answer, rewards", [("Answer: 14", [0.0, 1.0]), ("Answer: 15", [1.0, 0.0])])
async def test_adversarial_rewards_survival_and_breaking(arith_url, solver_answer, rewards):
    def script(body, session_id):
        if "<problem>" in body["messages"][0]["content"]:
            return Reply(content="<problem>What is 2 + 3 × 4?</problem> <expression>2 + 3 * 4</expression>")
        assert body["messages"][1]["content"] == "What is 2 + 3 × 4?"
        return Reply(content=solver_answer)

    with ScriptedChat(script).serve() as chat_url:
        outs = await rewarded(AdversarialAgent().play(HttpSessionPool(chat_url), arith_row(arith_url), request_kwargs={}), EnvScore())
    assert [o.role for o in outs] == ["proposer", "solver"] and [o.reward for o in outs] == rewards
    assert outs[0].details["label"] == 14


async def test_adversarial_invalid_variant_counts_nothing(arith_url):
    chat = ScriptedChat([Reply(content="<problem>Hard one</problem><expression>7 / 2</expression>")])
    with chat.serve() as chat_url:
        outs = await rewarded(AdversarialAgent().play(HttpSessionPool(chat_url), arith_row(arith_url), request_kwargs={}), EnvScore())
    assert [o.role for o in outs] == ["proposer"] and outs[0].reward == 0.0 and len(chat.requests) == 1
    assert "not an integer" in outs[0].details["invalid_reason"]


def test_variant_checks():
    assert evaluate("(3 + 4) × 2 − 1") == 13 and evaluate("2^10 mod 7") == 2
    for bad in ("__import__('os')", "10**100", "1/0", "x + 1", "2 ** 0.5"):
        with pytest.raises(InvalidProblem):
            evaluate(bad)
    with pytest.raises(InvalidProblem, match="stated answer"):
        parse_variant("<problem>p</problem><expression>6*7</expression> Answer: 41")
    assert parse_variant("<problem>p</problem><expression>6*7</expression> Answer: 42") == ("p", 42)
