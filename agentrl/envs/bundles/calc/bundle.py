"""The calc bundle: arithmetic through a calculator tool, then `submit_answer`.

An episode's one score is `grade` = 0.1 tool_used + 0.1 submitted + 0.8 correct, so a model that learns the
protocol (calculate, then submit) is paid before it gets answers right. It is one score because the env server
sends an episode's only score as its reward (`reward=env_score`; several scores would be a `reward_error`
under the run's own server). The three parts are the episode's `parts()`, and the bundle's `metrics()` reports
their means over the train episodes that ended since the last step (`env/correct`, `env/tool_used`,
`env/submitted`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from agentrl.envs.bundles import FolderBundle
from agentrl.envs.task import Episode, TaskInfo, ToolResult, Turn

from .evaluator import CalcError, calculate

TEACHERS = ("optimal",)
MAX_CALCULATIONS = 8  # calculate calls per episode; a problem needs one or two
MAX_ANSWER_CHARS = 64
WEIGHTS = {"tool_used": 0.1, "submitted": 0.1, "correct": 0.8}
# Short on purpose: a 135M model reads it, and the whole conversation (tool schemas, two calls, their results)
# should stay near 300 tokens.
SYSTEM_PROMPT = "Use calculate for the arithmetic, then call submit_answer with the result."
CALCULATE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate arithmetic, e.g. 347 * 29",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
SUBMIT_ANSWER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit_answer",
        "description": "Submit the final answer (ends the task)",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}
TOOLS = [CALCULATE_TOOL, SUBMIT_ANSWER_TOOL]
_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?")
_GROUPED = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")


def parse_answer(answer: Any) -> Fraction | None:
    """A submitted answer's value: an integer or decimal, as a string ("10,063" and "10063.0" too) or a JSON
    number; None when it is not one."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return Fraction(answer)
    if isinstance(answer, float):
        return Fraction(repr(answer)) if answer == answer and abs(answer) != float("inf") else None
    if not isinstance(answer, str) or len(answer) > MAX_ANSWER_CHARS:
        return None
    text = answer.strip()
    if _GROUPED.fullmatch(text):
        text = text.replace(",", "")
    return Fraction(text) if _NUMBER.fullmatch(text) else None


def grade(parts: dict[str, float]) -> float:
    """The episode's score from its parts; tenths summed as integers so 1.0 is exactly 1.0."""
    return sum(round(10 * WEIGHTS[k]) * int(parts[k]) for k in WEIGHTS) / 10


def _reply(payload: dict[str, Any], *, error: bool = False, done: bool = False) -> ToolResult:
    return ToolResult(json.dumps(payload), is_error=error, done=done)


class CalcEpisode(Episode):
    """One problem: any number of `calculate` calls (up to MAX_CALCULATIONS), ended by `submit_answer` or by a
    plain reply (which scores no `submitted` and no `correct`)."""

    def __init__(self, row: dict[str, Any], info: TaskInfo,
                 on_end: Callable[[dict[str, float]], None] | None = None) -> None:
        self._row = row  # holds the answer: never shown to the agent
        self.info = info
        self._on_end = on_end
        self._done = False
        self.calculations = 0  # calls answered with a result
        self.answer: str | None = None
        self._parts = {"tool_used": 0.0, "submitted": 0.0, "correct": 0.0}

    def first_turn(self) -> Turn:
        return Turn(prompt=self._row["question"], system_prompt=SYSTEM_PROMPT, tools=[dict(t) for t in TOOLS])

    @property
    def done(self) -> bool:
        return self._done

    def parts(self) -> dict[str, float]:
        """correct, tool_used and submitted, each 0 or 1, once the episode is over; {} before."""
        return dict(self._parts) if self._done else {}

    def scores(self) -> dict[str, float]:
        return {"grade": grade(self._parts)} if self._done else {}

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self._done:
            return _reply({"error": "the task is over; an answer was already submitted"}, error=True, done=True)
        if not isinstance(arguments, dict):
            return _reply({"error": "the arguments must be a JSON object"}, error=True)
        if name == "calculate":
            return self._calculate(arguments)
        if name == "submit_answer":
            return self._submit(arguments)
        return _reply({"error": f"unknown tool {str(name)[:40]!r}; the tools are calculate and submit_answer"},
                      error=True)

    def _calculate(self, arguments: dict[str, Any]) -> ToolResult:
        if self.calculations >= MAX_CALCULATIONS:
            return _reply({"error": f"at most {MAX_CALCULATIONS} calculations; submit your answer"}, error=True)
        if "expression" not in arguments:
            return _reply({"error": "calculate takes {\"expression\": \"347 * 29\"}"}, error=True)
        try:
            result = calculate(arguments["expression"])
        except CalcError as exc:
            return _reply({"error": str(exc)}, error=True)
        self.calculations += 1
        self._parts["tool_used"] = 1.0
        return _reply({"result": result})

    def _submit(self, arguments: dict[str, Any]) -> ToolResult:
        value = parse_answer(arguments.get("answer"))
        if value is None:
            # Not ended: a malformed answer is no answer, and the model may try again.
            return _reply({"accepted": False, "error": "give the answer as a number, e.g. {\"answer\": \"10063\"}"},
                          error=True)
        self.answer = str(arguments["answer"]).strip()
        self._parts["submitted"] = 1.0
        self._parts["correct"] = 1.0 if value == Fraction(self._row["answer"]) else 0.0
        self._end()
        return _reply({"accepted": True, "answer": self.answer}, done=True)

    def end_turn(self, response: str) -> Turn | None:
        # A plain reply ends the task unsubmitted: submitting is part of the protocol being learned.
        if not self._done:
            self._end()
        return None

    def _end(self) -> None:
        self._done = True
        if self._on_end is not None:
            self._on_end(dict(self._parts))


class CalcBundle(FolderBundle):
    """Generated calculator problems in four kinds (add, mul, div, word) and three levels."""

    inline_episodes = True  # microseconds of pure computation (the calculator bounds every input)
    teachers = TEACHERS
    eval_breakdown = {"kind": "reward_{}"}  # eval/reward_add, eval/reward_mul, eval/reward_div, eval/reward_word
    eval_strata = "kind"  # an eval of N tasks keeps the kinds' equal shares
    score_names = ("grade",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Sums of the parts of the train episodes ended since the last `metrics()`, and their count: the
        # server's thread adds, the trainer's reads.
        self._sums, self._count = dict.fromkeys(WEIGHTS, 0.0), 0
        self._lock = threading.Lock()

    def task_info(self, split: str, index: int) -> TaskInfo:
        r = self.row(split, index)
        return TaskInfo(task_id=r["task_id"], split=split, index=index,
                        extra={"kind": r["kind"], "level": r["level"]})

    def episode(self, split: str, index: int) -> CalcEpisode:
        on_end = self._record if split == self.train_split else None
        return CalcEpisode(self.row(split, index), self.task_info(split, index), on_end)

    def _record(self, parts: dict[str, float]) -> None:
        with self._lock:
            for k in WEIGHTS:
                self._sums[k] += parts[k]
            self._count += 1

    def metrics(self) -> dict[str, float]:
        """Means of the parts over the train episodes ended since the last call (played here: absent when the
        env server runs in another process or container)."""
        with self._lock:
            sums, count = self._sums, self._count
            self._sums, self._count = dict.fromkeys(WEIGHTS, 0.0), 0
        return {f"env/{k}": sums[k] / count for k in WEIGHTS} if count else {}

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        """The problem solved as taught: calculate the row's expression, then submit the result."""
        if teacher not in TEACHERS:
            raise ValueError(f"calc teacher must be one of {TEACHERS}, not {teacher!r}")
        row = self.row(split, index)
        episode = CalcEpisode(row, self.task_info(split, index))
        turn = episode.first_turn()
        messages: list[dict[str, Any]] = [{"role": "system", "content": turn.system_prompt},
                                          {"role": "user", "content": turn.prompt}]
        calls = (("calculate", {"expression": row["expression"]}), ("submit_answer", {"answer": row["answer"]}))
        for step, (name, arguments) in enumerate(calls):
            call_id = f"call_{split}_{index}_{step}"
            result = episode.call_tool(name, arguments)
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]},
                {"role": "tool", "tool_call_id": call_id, "name": name, "content": result.text},
            ]
        return messages
