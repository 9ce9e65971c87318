"""Role demonstrations: the SFT warm start of a multi-agent pattern trains on the pattern's own role turns.

A bundle's demonstration is one single-agent transcript (system, user, the teacher's reply and any tool answer).
An agent pattern with roles turns it into its role conversations (`<Agent>.demonstrations`), built by the same
prompt code it plays with, with the teacher's answer filled in. The helpers here read and rewrite that answer
without knowing the bundle: a task-tool call's one argument (GridSim's schedule) or a marked final answer
(arith's `Answer: N`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from agentrl.answers import extract_answer, to_number

Message = dict[str, Any]


@dataclass
class Demonstration:
    """One role turn worth learning: the conversation up to and including the reply, and the tools the agent
    sends with it at play time (None for a tool-less role turn)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


def split_transcript(transcript: list[Message]) -> tuple[str, str, list[Message]]:
    """(system prompt, task, teacher's turns) of a bundle's demonstration: the turns start at its first
    assistant message (a GridSim call and the tool's answer; arith's one reply)."""
    first = next(i for i, m in enumerate(transcript) if m.get("role") == "assistant")
    head = transcript[:first]
    system = "\n\n".join(str(m.get("content") or "") for m in head if m.get("role") == "system")
    task = [str(m.get("content") or "") for m in head if m.get("role") == "user"][-1]
    return system, task, [dict(m) for m in transcript[first:]]


def _last_reply_at(turns: list[Message]) -> int:
    return max(i for i, m in enumerate(turns) if m.get("role") == "assistant")


def _last_reply(turns: list[Message]) -> Message:
    return turns[_last_reply_at(turns)]


def teacher_answer(turns: list[Message]) -> str | None:
    """The teacher's final answer as an agent hands it to the task's tool (`episode.task_tool_call`): the
    one argument of its tool call as JSON text (a schedule list), else the final answer marked in its reply."""
    reply = _last_reply(turns)
    calls = reply.get("tool_calls") or []
    if calls:
        raw = calls[-1].get("function", {}).get("arguments", "{}")
        arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
        if len(arguments) != 1:
            return None
        value = next(iter(arguments.values()))
        return value if isinstance(value, str) else json.dumps(value)
    return extract_answer(str(reply.get("content") or ""))


def with_answer(turns: list[Message], answer: str) -> list[Message]:
    """The teacher's turns with its final answer replaced by `answer` (its tool call's argument, or the last
    occurrence of its marked answer in the reply); the tool's answer after a call is dropped (it graded the
    teacher's answer, not this one)."""
    reply = dict(_last_reply(turns))
    calls = reply.get("tool_calls") or []
    if calls:
        call = dict(calls[-1])
        fn = dict(call["function"])
        raw = fn.get("arguments", "{}")
        name = next(iter(json.loads(raw) if isinstance(raw, str) else raw))
        try:
            value: Any = json.loads(answer)
        except ValueError:
            value = answer
        fn["arguments"] = json.dumps({name: value})
        call["function"] = fn
        reply["tool_calls"] = [*calls[:-1], call]
    else:
        content, old = str(reply.get("content") or ""), teacher_answer(turns) or ""
        at = content.rfind(old)
        reply["content"] = content[:at] + answer + content[at + len(old):] if old and at >= 0 else answer
    return [*turns[:_last_reply_at(turns)], reply]


def corrupt(answer: str, rng: random.Random) -> str | None:
    """A different, worse answer of the same shape, for the roles that must tell answers apart: an integer moved
    by a few, or a list of numbers (a GridSim schedule) played backwards with its signs flipped (for a schedule
    that ends where it starts, still feasible: it charges when the answer sells) or all zeros (idle all day).
    None when neither applies."""
    number = to_number(answer)
    if number is not None and number.denominator == 1:
        step = rng.randint(1, max(3, abs(int(number)) // 4))
        return str(int(number) + rng.choice((-1, 1)) * step)
    try:
        value = json.loads(answer)
    except ValueError:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, int | float) for v in value):
        return None
    options = [moved for moved in ([-v for v in reversed(value)], [0] * len(value)) if moved != value]
    return json.dumps(rng.choice(options)) if options else None


def near_miss(answer: str, rng: random.Random) -> str | None:
    """A different answer a small step from `answer`, the kind of mistake a model that nearly knows the task
    makes: an integer moved by one or two, or a list of numbers (a GridSim schedule) with one or two local edits,
    each an action moved an hour earlier or later into an idle neighbour hour, or a charge dropped together
    with the first sell after it (a schedule stays feasible: its storage never leaves the range it had).
    None when neither applies (an idle schedule)."""
    number = to_number(answer)
    if number is not None and number.denominator == 1:
        return str(int(number) + rng.choice((-2, -1, 1, 2)))
    try:
        value = json.loads(answer)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int | float) for v in value):
        return None
    moved = list(value)
    for _ in range(rng.randint(1, 2)):
        shifts, drops = _local_edits(moved)
        # a shifted hour is the commoner slip (a drop costs a whole cycle's hour): three times in four
        edits = shifts if shifts and (not drops or rng.random() < 0.75) else drops
        if edits:
            moved = rng.choice(edits)
    return json.dumps(moved) if moved != value else None


def _local_edits(value: list) -> tuple[list[list], list[list]]:
    """Every list one local edit away (see `near_miss`): (actions shifted an hour, charge/sell pairs dropped)."""
    shifts = []
    for t in range(len(value) - 1):
        a, b = value[t], value[t + 1]
        if a != b and 0 in (a, b):
            shifts.append([*value[:t], b, a, *value[t + 2:]])
    drops = []
    for t, a in enumerate(value):
        if a > 0:
            sell = next((u for u in range(t + 1, len(value)) if value[u] < 0), None)
            if sell is not None:
                drops.append([0 if i in (t, sell) else v for i, v in enumerate(value)])
    return shifts, drops


def assistant(content: str) -> Message:
    """An assistant message with `content`."""
    return {"role": "assistant", "content": content}
