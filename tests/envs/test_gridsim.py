"""GridSim episodes: spec wiring tasks, feedback rules, malformed submissions, prompts, demonstrations."""

from __future__ import annotations

import json
import re

import pytest

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.gridsim import MAX_SUBMISSIONS
from agentrl.envs.task import ToolResult

TOOL = "submit_schedule"


@pytest.fixture(scope="module")
def bundle():
    return load_bundle("gridsim")


def _payload(result: ToolResult) -> dict:
    assert isinstance(result, ToolResult)
    return json.loads(result.text)


def _infeasible(duration: int) -> list[int]:
    return [-1] + [0] * 23  # sell on an empty battery


# --- the spec's CI wiring tasks --------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["eval", "train"])
def test_smoke_optimum_scores_one_and_idle_exactly_point_two(bundle, split):
    for index in range(0, bundle.splits()[split], 37):
        ep = bundle.episode(split, index)
        assert ep.scores() == {} and not ep.done
        res = ep.call_tool(TOOL, {"schedule": bundle.row(split, index)["optimal_schedule"]})
        assert res.done and not res.is_error and ep.done
        assert _payload(res)["reward"] == 1.0 and ep.scores() == {"grade": 1.0}
        idle = bundle.episode(split, index)
        assert _payload(idle.call_tool(TOOL, {"schedule": [0] * 24}))["profit_usd"] == 0
        assert idle.scores() == {"grade": 0.2}


def test_four_infeasible_submissions_score_zero(bundle):
    ep = bundle.episode("eval", 5)
    for used in range(1, MAX_SUBMISSIONS + 1):
        assert not ep.done
        out = _payload(ep.call_tool(TOOL, {"schedule": _infeasible(1)}))
        assert out["accepted"] is False and out["submissions_left"] == MAX_SUBMISSIONS - used
        assert out["done"] is (used == MAX_SUBMISSIONS)
    assert out["reward"] == 0.0 and ep.done and ep.scores() == {"grade": 0.0}
    late = ep.call_tool(TOOL, {"schedule": [0] * 24})
    assert late.done and "episode is over" in _payload(late)["error"] and ep.scores() == {"grade": 0.0}


def test_no_submission_scores_zero(bundle):
    ep = bundle.episode("eval", 9)
    assert ep.end_turn("I would rather not trade today.") is None
    assert ep.done and ep.scores() == {"grade": 0.0}
    assert ep.state()["end_reason"] == "no_submission"


def test_stored_greedy_scores_reproduce_on_every_eval_day(bundle):
    for index in range(200):
        row = bundle.row("eval", index)
        ep = bundle.episode("eval", index)
        ep.call_tool(TOOL, {"schedule": row["greedy_schedule"]})
        assert ep.scores() == {"grade": row["greedy_score"]}


def test_resubmission_after_infeasible_is_graded(bundle):
    row = bundle.row("eval", 150)
    ep = bundle.episode("eval", 150)
    assert not ep.call_tool(TOOL, {"schedule": [1] * 24}).done
    res = ep.call_tool(TOOL, {"schedule": row["optimal_schedule"]})
    assert res.done and ep.scores() == {"grade": 1.0}
    assert ep.end_turn("done") is None and ep.scores() == {"grade": 1.0}
    again = ep.call_tool(TOOL, {"schedule": [0] * 24})
    assert "already been graded" in _payload(again)["error"] and ep.scores() == {"grade": 1.0}


def test_a_money_losing_schedule_scores_below_idle_by_the_formula(bundle):
    row = bundle.row("eval", 20)
    prices, b = row["prices"], row["battery"]
    # Buy at the dearest hour that has a later, cheaper hour to sell in.
    t1, t2 = max(((i, j) for i in range(24) for j in range(i + 1, 24)),
                 key=lambda ij: prices[ij[0]] - b["efficiency"] * prices[ij[1]])
    sched = [0] * 24
    sched[t1], sched[t2] = 1, -1
    ep = bundle.episode("eval", 20)
    out = _payload(ep.call_tool(TOOL, {"schedule": sched}))
    profit = b["power_mw"] * (b["efficiency"] * prices[t2] - prices[t1])
    assert out["profit_usd"] == pytest.approx(profit, abs=0.01) and profit < 0
    expected = max(0.0, 0.2 + 0.8 * profit / row["optimal_profit"])
    assert ep.scores()["grade"] == pytest.approx(expected, abs=1e-6) and expected < 0.2


# --- feedback rules: what the tool tells a schedule that breaks the battery ----------------------------


def test_storage_feedback_lists_hours_levels_and_trace(bundle):
    ep = bundle.episode("eval", 199)  # a 4-hour battery
    assert bundle.task_info("eval", 199).extra["duration_h"] == 4
    sched = [0] * 7 + [-1] + [1] * 5 + [0] * 11
    out = _payload(ep.call_tool(TOOL, {"schedule": sched}))
    assert out["problems"] == ["HE08: sell, but the battery is empty (0/4 hours stored)",
                               "HE13: charge, but the battery is already full (4/4 hours stored)"]
    assert out["problem_count"] == 2 and out["submissions_left"] == 3 and out["done"] is False
    trace = out["storage_after_each_hour_if_infeasible_hours_were_idle"]
    assert trace == [0] * 8 + [1, 2, 3, 4, 4] + [4] * 11
    assert "profit_usd" not in out and "reward" not in out


def test_problem_lines_are_capped_at_eight(bundle):
    out = _payload(bundle.episode("eval", 0).call_tool(TOOL, {"schedule": [-1] * 24}))
    assert len(out["problems"]) == 8 and out["problem_count"] == 24


# --- malformed submissions are answered, never raised --------------------------------------------------

MALFORMED = [
    ({"schedule": [0] * 23}, "schedule has 23 entries; it needs exactly 24 (HE01..HE24)"),
    ({"schedule": [0] * 6 + [2] + [0] * 17}, "HE07: 2 is not -1, 0 or 1"),
    ({"schedule": [0, 0, "x"] + [0] * 21}, "HE03: 'x' is not an integer"),
    ({"schedule": [0, 0.5] + [0] * 22}, "HE02: 0.5 is not an integer"),
    ({"schedule": [True] + [0] * 23}, "HE01: true is not an integer"),
    ({"schedule": [None] + [0] * 23}, "HE01: null is not an integer"),
    ({"schedule": [[1]] + [0] * 23}, "HE01: [1] is not an integer"),
    ({"schedule": "not json"}, "schedule is not a JSON list of 24 integers"),
    ({"schedule": {"a": 1}}, "schedule is not a JSON list of 24 integers"),
    ({"schedule": 7}, "schedule is not a JSON list of 24 integers"),
    ({}, "missing the 'schedule' argument"),
    ({"plan": [0] * 24}, "missing the 'schedule' argument"),
]


@pytest.mark.parametrize("arguments,problem", MALFORMED)
def test_malformed_submission_is_answered_with_the_problem(bundle, arguments, problem):
    ep = bundle.episode("eval", 1)
    res = ep.call_tool(TOOL, arguments)
    out = _payload(res)
    assert not res.is_error and not res.done and out["accepted"] is False
    assert any(p.startswith(problem) for p in out["problems"]), out["problems"]
    assert "storage_after_each_hour_if_infeasible_hours_were_idle" not in out
    assert out["submissions_left"] == 3 and ep.scores() == {}


@pytest.mark.parametrize("wrap", [
    lambda s: {"schedule": json.dumps(s)},
    lambda s: {"schedule": json.dumps({"schedule": s})},
    lambda s: json.dumps({"schedule": s}),
    lambda s: {"schedule": [float(x) for x in s], "note": "extra keys are ignored"},
])
def test_lenient_wrappings_are_accepted(bundle, wrap):
    row = bundle.row("eval", 2)
    ep = bundle.episode("eval", 2)
    res = ep.call_tool(TOOL, wrap(row["optimal_schedule"]))
    assert res.done and ep.scores() == {"grade": 1.0}


@pytest.mark.parametrize("arguments", [None, "", "[1, 0]", 42, ["not", "a", "dict"]])
def test_arguments_that_are_not_an_object_are_answered(bundle, arguments):
    res = bundle.episode("eval", 1).call_tool(TOOL, arguments)
    out = _payload(res)
    assert out["accepted"] is False and not res.done and out["problems"]


def test_unknown_tool_is_an_error_that_costs_nothing(bundle):
    ep = bundle.episode("eval", 3)
    res = ep.call_tool("get_optimum", {})
    assert res.is_error and not res.done and "submit_schedule" in _payload(res)["error"]
    out = _payload(ep.call_tool(TOOL, {"schedule": [5] * 24}))
    assert out["submissions_left"] == 3


# --- what the agent sees --------------------------------------------------------------------------------


def test_full_prompt_matches_the_spec_layout_and_hides_references(bundle):
    row = bundle.row("eval", 144)
    turn = bundle.episode("eval", 144).first_turn()
    b = row["battery"]
    assert turn.system_prompt.startswith("You operate a grid-scale battery in ERCOT's day-ahead market.")
    assert f"a {b['power_mw']} MW / {b['energy_mwh']} MWh battery at settlement point {row['settlement_point']}" \
        in turn.prompt
    assert f"HE09 {row['prices'][8]:8.2f}" in turn.prompt and "you have 4 submissions in all" in turn.prompt
    assert [t["function"]["name"] for t in turn.tools] == [TOOL]
    text = turn.prompt + turn.system_prompt + json.dumps(turn.tools)
    assert f"{row['optimal_profit']:.2f}" not in text and "optim" not in text.lower()
    info = bundle.task_info("eval", 144)
    assert not {"optimal_profit", "optimal_schedule", "greedy_schedule", "greedy_score"} & set(info.extra)


def test_compact_prompt_is_short_and_has_the_same_facts():
    compact = load_bundle("gridsim", prompt_style="compact")
    row = compact.row("eval", 144)
    turn = compact.episode("eval", 144).first_turn()
    b = row["battery"]
    m = re.fullmatch(r"D=(\d) eta=(\d+) P=(\d+) \| ((?:-?\d+ ){23}-?\d+)", turn.prompt)
    assert m, turn.prompt
    assert (int(m[1]), int(m[2]), int(m[3])) == (b["duration_h"], round(b["efficiency"] * 100), b["power_mw"])
    assert [int(x) for x in m[4].split()] == [round(p) for p in row["prices"]]
    assert len(turn.prompt.split()) < 40 and len(turn.system_prompt.split()) < 60


def test_task_ids_are_unique_and_readable(bundle):
    ids = [bundle.task_info(s, i).task_id for s, n in bundle.splits().items() for i in range(n)]
    assert len(set(ids)) == len(ids) == 2200
    info = bundle.task_info("eval", 42)
    assert re.fullmatch(r"gridsim-eval-0042-\d{4}-\d\d-\d\d-[A-Z_]+-D[124]", info.task_id)
    with pytest.raises(IndexError):
        bundle.task_info("eval", 200)
    with pytest.raises(KeyError):
        bundle.episode("test", 0)


# --- SFT demonstrations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("teacher", ["optimal", "greedy"])
def test_demonstration_messages(bundle, teacher):
    row = bundle.row("train", 11)
    msgs = bundle.demonstration("train", 11, teacher)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    call = msgs[2]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == TOOL
    assert msgs[3]["tool_call_id"] == call["id"]
    args = json.loads(call["function"]["arguments"])
    expected = row["optimal_schedule" if teacher == "optimal" else "greedy_schedule"]
    assert args == {"schedule": expected}
    reward = json.loads(msgs[3]["content"])["reward"]
    assert reward == (1.0 if teacher == "optimal" else row["greedy_score"])
    assert msgs[1]["content"] == bundle.episode("train", 11).first_turn().prompt
    with pytest.raises(ValueError, match="teacher"):
        bundle.demonstration("train", 11, "oracle")


def test_demonstration_variant_is_the_same_day_with_another_battery_played_optimally() -> None:
    import random

    from agentrl.envs.bundles.gridsim.battery import Battery, greedy, is_feasible, optimum, profit_units
    from agentrl.envs.bundles.gridsim.tasks import cents_of

    bundle = load_bundle("gridsim", prompt_style="compact")
    record = bundle.row("train", 3)
    rng = random.Random(0)
    seen = set()
    for _ in range(12):
        for teacher in ("optimal", "greedy"):
            msgs = bundle.demonstration_variant("train", 3, teacher, random.Random(rng.random()))
            header, prices = msgs[1]["content"].split(" | ")
            assert prices == bundle.demonstration("train", 3, teacher)[1]["content"].split(" | ")[1]
            fields = dict(f.split("=") for f in header.split())
            battery = Battery(int(fields["P"]), int(fields["D"]), int(fields["eta"]))
            seen.add(battery.duration_h)
            schedule = json.loads(msgs[2]["tool_calls"][0]["function"]["arguments"])["schedule"]
            cents = cents_of(record)
            best, _ = optimum(cents, battery)
            assert is_feasible(schedule, battery.duration_h)
            if teacher == "optimal":
                assert profit_units(cents, schedule, battery) == best
            else:
                assert schedule == greedy(cents, battery)
    assert seen == {1, 2, 4}


def test_generated_days_are_fresh_train_date_days_played_by_the_teacher() -> None:
    from agentrl.envs.bundles.gridsim.tasks import generated_task, split_dates

    bundle = load_bundle("gridsim", prompt_style="compact")
    train_dates, eval_dates = set(map(str, split_dates()["train"])), set(map(str, split_dates()["eval"]))
    stored = {tuple(r["prices"]) for r in bundle.rows("train")}
    records = [generated_task(i, seed=3) for i in range(300)]
    assert all(r["date"] in train_dates and r["date"] not in eval_dates for r in records)
    assert not stored & {tuple(r["prices"]) for r in records}  # new days, not the stored pack's
    assert len({tuple(r["prices"]) for r in records}) == 300
    assert {r["battery"]["duration_h"] for r in records} == {1, 2, 4}
    assert generated_task(7, seed=3) == records[7] and generated_task(7, seed=4) != records[7]
    for teacher in ("optimal", "greedy"):
        msgs = bundle.generated_demonstration(7, teacher, seed=3)
        schedule = json.loads(msgs[2]["tool_calls"][0]["function"]["arguments"])["schedule"]
        key = "optimal_schedule" if teacher == "optimal" else "greedy_schedule"
        assert schedule == records[7][key]
        assert json.loads(msgs[3]["content"])["reward"] == (1.0 if teacher == "optimal" else records[7]["greedy_score"])
    with pytest.raises(IndexError):
        generated_task(-1)


def test_compact_style_serves_a_short_tool_schema_for_the_same_arguments() -> None:
    from agentrl.envs.bundles.gridsim import SUBMIT_SCHEDULE_TOOL

    full = load_bundle("gridsim", prompt_style="full").episode("eval", 0).first_turn().tools
    compact = load_bundle("gridsim", prompt_style="compact").episode("eval", 0).first_turn().tools
    assert full == [SUBMIT_SCHEDULE_TOOL]
    (tool,) = compact
    assert tool["function"]["name"] == "submit_schedule"
    assert tool["function"]["parameters"]["required"] == ["schedule"]
    assert len(json.dumps(tool)) < len(json.dumps(SUBMIT_SCHEDULE_TOOL)) / 2
