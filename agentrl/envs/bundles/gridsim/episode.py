"""The GridSim episode: up to 4 submissions of a 24-hour schedule, graded against the optimum."""

from __future__ import annotations

import json
from typing import Any

from agentrl.envs.task import Episode, TaskInfo, ToolResult, Turn

from .battery import HOURS, UNITS_PER_USD, Battery, profit_units, score, storage_trace
from .prompts import TOOL_NAME, system_prompt, tool_schema, user_prompt

MAX_SUBMISSIONS = 4
MAX_PROBLEM_LINES = 8
NOT_A_LIST = f"schedule is not a JSON list of {HOURS} integers"


def _show(x: Any) -> str:
    if isinstance(x, str):
        return repr(x)
    try:
        return json.dumps(x)
    except (TypeError, ValueError):
        return repr(x)


def parse_schedule(arguments: Any) -> tuple[list[int] | None, list[str]]:
    """A submission's schedule, or None and the format problems found. Lenient on wrapping:
    the list may come as a JSON string, or as a JSON string of `{"schedule": [...]}`."""
    value = arguments
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None, [NOT_A_LIST]
    if isinstance(value, dict):
        if "schedule" not in value:
            return None, [f"missing the 'schedule' argument: {NOT_A_LIST}, e.g. {{\"schedule\": [0, 1, ...]}}"]
        value = value["schedule"]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None, [NOT_A_LIST]
        if isinstance(value, dict) and "schedule" in value:
            value = value["schedule"]
    if not isinstance(value, list):
        return None, [NOT_A_LIST]

    problems = []
    if len(value) != HOURS:
        problems.append(f"schedule has {len(value)} entries; it needs exactly {HOURS} (HE01..HE{HOURS})")
    schedule = []
    for t, x in enumerate(value):
        if isinstance(x, float) and x.is_integer():
            x = int(x)
        if isinstance(x, bool) or not isinstance(x, int):
            problems.append(f"HE{t + 1:02d}: {_show(x)} is not an integer")
        elif x not in (-1, 0, 1):
            problems.append(f"HE{t + 1:02d}: {x} is not -1, 0 or 1")
        else:
            schedule.append(x)
    return (None, problems) if problems else (schedule, [])


def parse_day(record: dict[str, Any]) -> tuple[tuple[int, ...], Battery, int]:
    """A record's exact inputs: prices in cents, the battery, and the optimum in 1e-4 $."""
    cents = tuple(int(round(p * 100)) for p in record["prices"])
    return cents, Battery.from_json(record["battery"]), int(round(record["optimal_profit"] * UNITS_PER_USD))


class GridSimEpisode(Episode):
    """One day with one battery. Plain state: cheap to create, grade and throw away."""

    def __init__(self, record: dict[str, Any], info: TaskInfo, prompt_style: str = "full",
                 day: tuple[tuple[int, ...], Battery, int] | None = None, prompt: str | None = None) -> None:
        """`day` is (prices in cents, battery, optimum in 1e-4 $), parsed from `record` when not given;
        `prompt` is the rendered user prompt when the caller has it cached."""
        self._record = record  # holds references: never rendered into anything the agent reads
        self.info = info
        self._style = prompt_style
        self._cents, self._battery, self._best_units = day or parse_day(record)
        self._prompt = prompt
        self.submissions_used = 0
        self.schedule: list[int] | None = None
        self.profit_units: int | None = None
        self._grade: float | None = None
        self._done = False
        self.end_reason: str | None = None

    def first_turn(self) -> Turn:
        if self._prompt is None:
            self._prompt = user_prompt(self._record, self._style)
        return Turn(prompt=self._prompt, system_prompt=system_prompt(self._style),
                    tools=[tool_schema(self._style)])

    @property
    def done(self) -> bool:
        return self._done

    def scores(self) -> dict[str, float]:
        if self._grade is not None:
            return {"grade": self._grade}
        return {"grade": 0.0} if self._done else {}

    def state(self) -> dict[str, Any]:
        """Public progress (never the references): what `data/get` may return."""
        return {"task_id": self.info.task_id, "submissions_used": self.submissions_used, "done": self._done,
                "end_reason": self.end_reason, "schedule": self.schedule, "grade": self.scores().get("grade"),
                "reward": self.scores().get("grade")}

    def end_turn(self, response: str) -> Turn | None:
        # The agent stopped calling tools: the day is over, graded if it submitted, else 0.
        self._finish("end_turn" if self._grade is not None else "no_submission")
        return None

    def _finish(self, reason: str) -> None:
        if not self._done:
            self._done = True
            self.end_reason = reason

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != TOOL_NAME:
            return ToolResult(json.dumps({"error": f"unknown tool {name!r}; the only tool is {TOOL_NAME}"}),
                              is_error=True, done=self._done)
        if self._done:
            why = "the day has already been graded" if self._grade is not None else "no submissions are left"
            return ToolResult(json.dumps({"error": f"the episode is over; {why}"}), is_error=True, done=True)

        self.submissions_used += 1
        left = MAX_SUBMISSIONS - self.submissions_used
        schedule, problems = parse_schedule(arguments)
        trace = None
        if schedule is not None:
            violations, trace = storage_trace(schedule, self._battery.duration_h)
            problems = [self._describe(t, a, soc) for t, a, soc in violations]
        if not problems:
            return self._grade_schedule(schedule)

        out: dict[str, Any] = {"accepted": False, "feasible": False, "problems": problems[:MAX_PROBLEM_LINES],
                               "problem_count": len(problems), "submissions_left": left, "done": left == 0}
        if trace is not None:
            out["storage_after_each_hour_if_infeasible_hours_were_idle"] = trace
        if left == 0:
            out["reward"] = 0.0
            self._finish("out_of_submissions")
        return ToolResult(json.dumps(out), done=left == 0)

    def _describe(self, t: int, a: int, soc: int) -> str:
        d = self._battery.duration_h
        if a == -1:
            return f"HE{t + 1:02d}: sell, but the battery is empty ({soc}/{d} hours stored)"
        return f"HE{t + 1:02d}: charge, but the battery is already full ({soc}/{d} hours stored)"

    def _grade_schedule(self, schedule: list[int]) -> ToolResult:
        units = profit_units(self._cents, schedule, self._battery)
        self.schedule, self.profit_units = schedule, units
        self._grade = score(units, self._best_units)
        self._finish("graded")
        out = {"accepted": True, "feasible": True, "profit_usd": round(units / UNITS_PER_USD, 2),
               "reward": self._grade, "done": True}
        return ToolResult(json.dumps(out), done=True)
