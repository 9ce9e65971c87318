"""env=calc: the calculator, the grading, episodes played over the real env server, the stored splits."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hydra.utils import instantiate

from agentrl.agents.base import HttpSessionPool
from agentrl.agents.tool_calling import ToolCallingAgent
from agentrl.envs.bundles import load_bundle, shipped_folder
from agentrl.envs.bundles.calc import CalcError, calculate, evaluator, grade, parse_answer
from agentrl.envs.bundles.calc.build import build
from agentrl.envs.bundles.calc.bundle import MAX_CALCULATIONS
from agentrl.envs.bundles.calc.problems import KINDS, LEVELS
from agentrl.envs.client import EpisodeClient
from agentrl.envs.server import build_app, serve_in_background
from agentrl.play.eval_subset import eval_subset
from agentrl.rewards import EnvScore
from agentrl.testing import Reply, ScriptedChat, tool_call
from agentrl.testing.config import compose_config
from agentrl.testing.plays import rewarded
from agentrl.testing.scripted_chat import sglang_tool_parser


@pytest.fixture(scope="module")
def calc():
    return load_bundle("calc")


# --- the calculator ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("expression", "value"), [
    ("347 * 29", "10063"),
    ("1234 + 5678 - 910", "6002"),
    ("10065 / 15", "671"),  # an exact quotient is an integer, not 671.0
    ("(19502 + 586) / 36", "558"),
    ("0.1 + 0.2", "0.3"),  # exact decimals, not binary floats
    ("1 / 3", "0.3333333333"),
    ("-2 / 3", "-0.6666666667"),
    ("-7 // 2", "-4"),
    ("-7 % 3", "2"),
    ("2 ** 10", "1024"),
    ("2 ** -2", "0.25"),
    ("-(3 - 5)", "2"),
    ("1,234 * 2", "2468"),  # a thousands separator, not a tuple
    ("12 × 3 ÷ 4 − 1", "8"),  # the symbols a model copies from text
    ("2^10", "1024"),
    ("  347*29 = ", "10063"),
    ("1e3 + 1", "1001"),
    ("999999999999999 * 999999999999999", "999999999999998000000000000001"),
])
def test_the_calculator_is_exact(expression: str, value: str):
    assert calculate(expression) == value


HOSTILE = [
    ("9**9**9", "exponent"),
    ("2 ** 100000000", "exponent"),
    ("99999 ** 64", "too large"),
    ("10 ** 31", "too large"),
    ("(10 ** 15) ** 2 * 10", "too large"),
    ("9" * 40, "too large"),
    ("1e400", "not finite"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("2 ** 0.5", "whole number"),
    ("x", "the name 'x'"),
    ("nan", "the name 'nan'"),
    ("inf * 1", "the name 'inf'"),
    ("__import__('os').system('echo hi')", "function call"),
    ("abs(-3)", "function call"),
    ("(1).real", "attribute"),
    ("().__class__", "attribute"),
    ("'a' * 3", "only numbers"),
    ("True + 1", "only numbers"),
    ("1j * 1j", "only numbers"),
    ("[1, 2]", "List"),
    ("(1, 2)", "Tuple"),
    ("1 if 1 else 2", "IfExp"),
    ("lambda: 1", "Lambda"),
    ("1 < 2", "Compare"),
    ("3 & 1", "allowed"),
    ("-" * 150 + "1", "nested too deeply"),
    ("(-" * 60 + "1" + ")" * 60, "nested too deeply"),
    ("(" * 99 + "1" + ")" * 99, None),  # parentheses alone nest no node: fine, 1
    ("1 +", "cannot parse"),
    ("import os", "cannot parse"),
    ("1\x00", "cannot parse"),
    ("", "empty"),
    ("   =", "empty"),
    ("1" * 10_000_000, "too long"),
    ("(" * 10_000_000, "too long"),
]


@pytest.mark.parametrize(("expression", "why"), HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_hostile_expressions_get_an_error_text(expression: str, why: str | None):
    if why is None:
        assert calculate(expression) == "1"
        return
    with pytest.raises(CalcError, match=why):
        calculate(expression)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 347, 2.5, None, ["1 + 1"], {"e": "1"}, b"1 + 1", True])
def test_an_expression_that_is_not_a_string_is_refused(value):
    with pytest.raises(CalcError, match="must be a string"):
        calculate(value)


def test_a_long_expression_is_refused_before_it_is_parsed(monkeypatch):
    """10 MB of text must cost a length check, never a parse (ast would build a huge tree, or recurse)."""
    def no_parse(*args, **kwargs):
        raise AssertionError("parsed")

    monkeypatch.setattr(evaluator.ast, "parse", no_parse)
    for text in ("1+" * 5_000_000 + "1", "(" * 10_000_000):
        with pytest.raises(CalcError, match="too long"):
            calculate(text)


def test_a_power_too_large_is_refused_before_it_is_computed(monkeypatch):
    """`7 ** 60` (~169 bits) is refused from the operands' sizes, before Fraction.__pow__ runs."""
    called = []
    real_pow = evaluator.Fraction.__pow__
    monkeypatch.setattr(evaluator.Fraction, "__pow__", lambda a, b: called.append(b) or real_pow(a, b))
    with pytest.raises(CalcError, match="too large"):
        calculate("12345 ** 20")
    assert called == []
    assert calculate("2 ** 64") == str(2 ** 64) and called == [64]


# --- the grading ------------------------------------------------------------------------------------------------

def _episode(calc, split="eval", index=9):
    return calc.episode(split, index), calc.row(split, index)


def test_grade_weights_the_parts():
    assert grade({"tool_used": 1, "submitted": 1, "correct": 1}) == 1.0
    assert grade({"tool_used": 1, "submitted": 1, "correct": 0}) == 0.2
    assert grade({"tool_used": 0, "submitted": 1, "correct": 1}) == 0.9
    assert grade({"tool_used": 1, "submitted": 0, "correct": 0}) == 0.1
    assert grade({"tool_used": 0, "submitted": 0, "correct": 0}) == 0.0


def test_calculate_then_the_right_answer_scores_one(calc):
    ep, row = _episode(calc)
    assert ep.scores() == {} and ep.parts() == {}
    r = ep.call_tool("calculate", {"expression": row["expression"]})
    assert json.loads(r.text) == {"result": row["answer"]} and not r.is_error and not r.done and not ep.done
    r = ep.call_tool("submit_answer", {"answer": row["answer"]})
    assert r.done and ep.done and json.loads(r.text)["accepted"] is True
    assert ep.scores() == {"grade": 1.0}
    assert ep.parts() == {"tool_used": 1.0, "submitted": 1.0, "correct": 1.0}
    again = ep.call_tool("submit_answer", {"answer": "0"})
    assert again.is_error and ep.scores() == {"grade": 1.0}  # only the first submission counts


@pytest.mark.parametrize(("calls", "parts"), [
    ([("submit_answer", "RIGHT")], (0, 1, 1)),  # right without the calculator: 0.9
    ([("calculate", "1 + 1"), ("submit_answer", "WRONG")], (1, 1, 0)),  # the protocol, a wrong answer: 0.2
    ([("calculate", "x + 1"), ("submit_answer", "RIGHT")], (0, 1, 1)),  # a refused calculation is no tool use
    ([("calculate", "EXPR"), ("submit_answer", "ten thousand"), ("submit_answer", "RIGHT")], (1, 1, 1)),
])
def test_partial_credit(calc, calls, parts):
    ep, row = _episode(calc, index=5)
    subs = {"RIGHT": row["answer"], "WRONG": str(int(row["answer"]) + 1), "EXPR": row["expression"]}
    for name, arg in calls:
        key = "expression" if name == "calculate" else "answer"
        ep.call_tool(name, {key: subs.get(arg, arg)})
    assert ep.done
    assert ep.parts() == dict(zip(("tool_used", "submitted", "correct"), map(float, parts), strict=True))
    assert ep.scores() == {"grade": grade(ep.parts())}


def test_a_plain_text_answer_scores_no_correct_and_no_submitted(calc):
    ep, row = _episode(calc)
    ep.call_tool("calculate", {"expression": row["expression"]})
    assert ep.end_turn(f"The answer is {row['answer']}. Answer: {row['answer']}") is None
    assert ep.done and ep.parts() == {"tool_used": 1.0, "submitted": 0.0, "correct": 0.0}
    assert ep.scores() == {"grade": 0.1}
    ep2, row2 = _episode(calc, index=2)
    ep2.end_turn(row2["answer"])
    assert ep2.scores() == {"grade": 0.0}


@pytest.mark.parametrize("answer", ["RIGHT", " RIGHT ", "RIGHT.0", "+RIGHT", "GROUPED", "INT"])
def test_equivalent_forms_of_the_right_answer_are_correct(calc, answer):
    ep, row = _episode(calc, index=7)  # 40015: four digits and more, so "40,015" is a grouped form
    value = row["answer"]
    grouped = f"{int(value):,}"
    assert "," in grouped
    arg = int(value) if answer == "INT" else answer.replace("RIGHT", value).replace("GROUPED", grouped)
    ep.call_tool("submit_answer", {"answer": arg})
    assert ep.parts()["correct"] == 1.0


@pytest.mark.parametrize("answer", ["", "ten", "1 0", "10,00", "1e3", "0x10", None, True, float("nan"),
                                    float("inf"), [1], {"a": 1}, "9" * 100])
def test_a_malformed_answer_is_refused_and_the_episode_goes_on(calc, answer):
    ep, row = _episode(calc)
    r = ep.call_tool("submit_answer", {"answer": answer})
    assert r.is_error and not r.done and not ep.done and ep.scores() == {}
    assert parse_answer(answer) is None
    ep.call_tool("submit_answer", {"answer": row["answer"]})
    assert ep.scores() == {"grade": 0.9}


def test_bad_calls_are_answered_never_raised(calc):
    ep, row = _episode(calc)
    for name, arguments in [("calculate", {}), ("calculate", {"expr": "1"}), ("calculate", "1 + 1"),
                            ("submit_answer", {}), ("rm", {"path": "/"}), ("calculate", {"expression": "9**9**9"}),
                            ("calculate", {"expression": float("nan")}), ("calculate", {"expression": "1" * 10**7})]:
        r = ep.call_tool(name, arguments)
        assert r.is_error and not r.done and "error" in json.loads(r.text)
    assert ep.calculations == 0 and not ep.done
    for _ in range(MAX_CALCULATIONS):
        assert not ep.call_tool("calculate", {"expression": "1 + 1"}).is_error
    capped = ep.call_tool("calculate", {"expression": "1 + 1"})
    assert capped.is_error and "submit" in json.loads(capped.text)["error"]


def test_train_episodes_feed_the_parts_metrics(calc):
    calc.metrics()  # drop anything earlier tests played
    for index, answer in ((0, None), (1, "0")):
        ep, row = _episode(calc, "train", index)
        ep.call_tool("calculate", {"expression": row["expression"]})
        ep.call_tool("submit_answer", {"answer": answer or row["answer"]})
    ev, row = _episode(calc, "eval", 0)
    ev.call_tool("submit_answer", {"answer": row["answer"]})  # eval episodes are not counted
    assert calc.metrics() == {"env/tool_used": 1.0, "env/submitted": 1.0, "env/correct": 0.5}
    assert calc.metrics() == {}


def test_the_teacher_solves_every_eval_task(calc):
    for index in range(calc.splits()["eval"]):
        messages = calc.demonstration("eval", index, "optimal")
        calls = [m["tool_calls"][0]["function"] for m in messages if m["role"] == "assistant"]
        assert [c["name"] for c in calls] == ["calculate", "submit_answer"]
        ep = calc.episode("eval", index)
        for c in calls:
            ep.call_tool(c["name"], json.loads(c["arguments"]))
        assert ep.scores() == {"grade": 1.0}
    with pytest.raises(ValueError, match="optimal"):
        calc.demonstration("eval", 0, "greedy")


# --- episodes over the real env server --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def calc_url(calc) -> Iterator[str]:
    with serve_in_background(build_app(calc, max_concurrent_envs=8, tool_timeout=10)) as url:
        yield url


async def _play(chat: ScriptedChat, url: str, index: int):
    with chat.serve() as chat_url:
        pool = HttpSessionPool(chat_url)
        row = {"messages": None, "metadata": {"url": url, "split": "eval", "index": index}}
        [out] = await rewarded(ToolCallingAgent(max_turns=4).play(pool, row, request_kwargs={}), EnvScore())
    return out


def _hermes(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


async def test_a_full_episode_with_hermes_tool_calls_earns_one(calc, calc_url):
    row = calc.row("eval", 9)
    chat = ScriptedChat([_hermes("calculate", {"expression": row["expression"]}),
                         _hermes("submit_answer", {"answer": row["answer"]})], tool_parser=sglang_tool_parser)
    out = await _play(chat, calc_url, 9)
    assert out.failure is None and out.scores == {"grade": 1.0} and out.reward == 1.0
    assert out.tool_calls == 2 and out.turns == 2
    first, second = chat.requests
    assert {t["function"]["name"] for t in first["tools"]} == {"calculate", "submit_answer", "end_turn"}
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == row["question"]
    tool_answer = second["messages"][-1]
    assert tool_answer["role"] == "tool" and json.loads(tool_answer["content"]) == {"result": row["answer"]}


async def test_hostile_calls_over_the_server_are_answered_and_the_episode_goes_on(calc, calc_url):
    row = calc.row("eval", 6)
    chat = ScriptedChat([
        Reply(tool_calls=[tool_call("calculate", {"expression": "9**9**9"}),
                          tool_call("calculate", {"expression": "(" * 1000}),
                          tool_call("calculate", {"expression": 12345})]),
        Reply(tool_calls=[tool_call("calculate", {"expression": row["expression"]})]),
        Reply(tool_calls=[tool_call("submit_answer", {"answer": str(int(row["answer"]) - 1)})]),
    ])
    out = await _play(chat, calc_url, 6)
    assert out.failure is None and out.scores == {"grade": 0.2} and out.reward == pytest.approx(0.2)
    answers = [json.loads(m["content"]) for m in chat.requests[1]["messages"] if m["role"] == "tool"]
    assert ["exponent", "too long", "must be a string"] == [
        next(w for w in ("exponent", "too long", "must be a string") if w in a["error"]) for a in answers]


async def test_a_plain_reply_over_the_server_scores_the_tool_use_only(calc, calc_url):
    row = calc.row("eval", 1)
    chat = ScriptedChat([Reply(tool_calls=[tool_call("calculate", {"expression": row["expression"]})]),
                         Reply(content=f"The answer is {row['answer']}.")])
    out = await _play(chat, calc_url, 1)
    assert out.failure is None and out.scores == {"grade": 0.1} and out.reward == pytest.approx(0.1)


async def test_the_env_server_sends_the_grade_as_the_reward(calc, calc_url):
    """Over the OpenEnv WebSocket protocol as a client plays it: reset, tool calls, the reward with done."""
    row = calc.row("eval", 3)
    async with EpisodeClient(calc_url) as env:
        prompt, system, tools = await env.reset("eval", 3)
        assert prompt == row["question"] and "calculate" in system
        assert {t["function"]["name"] for t in tools} >= {"calculate", "submit_answer"}
        step = await env.call("calculate", {"expression": row["expression"]})
        assert not step.done and step.reward is None and json.loads(step.text) == {"result": row["answer"]}
        result = await env.call("submit_answer", {"answer": row["answer"]})
    assert result.done and result.reward == 1.0 and result.scores == {"grade": 1.0} and result.failure is None
    assert httpx.get(f"{calc_url}/health", trust_env=False).status_code == 200


# --- the stored splits and the config ---------------------------------------------------------------------------

def test_build_reproduces_the_stored_files_bit_for_bit(tmp_path: Path):
    build(tmp_path)
    shipped = shipped_folder("calc")
    names = sorted(p.name for p in shipped.iterdir())
    assert names == ["bundle.json", "eval.jsonl.gz", "train.jsonl.gz"]
    for name in names:
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_the_eval_split_is_balanced_and_apart_from_train(calc):
    ev, train = calc.rows("eval"), calc.rows("train")
    assert len(ev) == 100 and len(train) == 2000
    assert Counter(r["kind"] for r in ev) == dict.fromkeys(KINDS, 25)
    for kind in KINDS:
        levels = Counter(r["level"] for r in ev if r["kind"] == kind)
        assert set(levels) == set(range(1, LEVELS + 1)) and max(levels.values()) - min(levels.values()) <= 1
    questions = [r["question"] for r in ev + train]
    assert len(set(questions)) == len(questions)  # no eval question in train, no duplicate
    for r in ev + train:  # the calculator agrees with the generator's own arithmetic
        assert calculate(r["expression"]) == r["answer"] and int(r["answer"]) >= 0
    assert calc.task_info("eval", 0).extra == {"kind": ev[0]["kind"], "level": ev[0]["level"]}
    assert calc.eval_breakdown == {"kind": "reward_{}"} and calc.score_names == ("grade",)


def test_an_eval_subset_keeps_the_kinds_equal_shares(calc):
    """calc declares `eval_strata = "kind"`: trainer.eval_limit=20 plays 5 tasks of each kind, the same ones every
    time."""
    assert calc.eval_strata == "kind"
    subset = eval_subset(calc, "eval", 20)
    assert subset.stratified_by == "kind" and subset.total == 100 and len(subset.indices) == 20
    assert Counter(calc.task_info("eval", i).extra["kind"] for i in subset.indices) == dict.fromkeys(KINDS, 5)
    assert subset.note == "20 of 100 tasks, stratified by kind"
    assert eval_subset(calc, "eval", 20).indices == subset.indices


def test_env_calc_composes_and_loads():
    cfg = compose_config("env=calc")
    assert cfg.env.bundle == "calc"
    bundle = instantiate(cfg.env)
    assert bundle.name == "calc" and bundle.splits() == {"train": 2000, "eval": 100}
    assert bundle.spec()["bundle"] == "calc"
