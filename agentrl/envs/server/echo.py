"""A tiny bundle for tests and benchmarks of the server and its clients (no data, no dependencies).

Each task asks the agent to end its turn with the reply `answer-<split>-<index>`; the score `match`
is 1.0 for exactly that reply, else 0.0. Tools: `echo` (returns its text), `sleep` (blocks for
`seconds`, to test timeouts), `finish` (ends the episode from a tool call, scoring its `answer`).
With `turns > 1` the task has that many turns; only the last reply is scored.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agentrl.envs.task import Bundle, Episode, TaskInfo, ToolResult, Turn

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Return the text unchanged.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "sleep",
            "description": "Wait for the given number of seconds.",
            "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Submit the final answer; ends the episode.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
        },
    },
]


class EchoEpisode(Episode):
    def __init__(self, info: TaskInfo, turns: int, marker_dir: str | None, extra_scores: bool) -> None:
        self.info = info
        self.answer = f"answer-{info.split}-{info.index}"
        self._turns_left = turns
        self._marker_dir = marker_dir
        self._extra_scores = extra_scores
        self._scores: dict[str, float] = {}
        self._done = False
        self.calls = 0

    def _turn(self) -> Turn:
        return Turn(
            prompt=f"Task {self.info.task_id}: end your turn with the reply {self.answer}.",
            system_prompt="You are a test agent.",
            tools=TOOLS,
        )

    def first_turn(self) -> Turn:
        return self._turn()

    def _grade(self, response: str) -> None:
        self._scores["match"] = 1.0 if response.strip() == self.answer else 0.0
        if self._extra_scores:
            self._scores["length"] = float(len(response))
        self._done = True

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls += 1
        if name == "echo":
            text = arguments.get("text")
            if not isinstance(text, str):
                return ToolResult("echo takes {'text': <string>}", is_error=True)
            return ToolResult(text)
        if name == "sleep":
            seconds = arguments.get("seconds")
            if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                return ToolResult("sleep takes {'seconds': <number>}", is_error=True)
            time.sleep(float(seconds))
            return ToolResult(f"slept {seconds}s")
        if name == "finish":
            answer = arguments.get("answer")
            if not isinstance(answer, str):
                return ToolResult("finish takes {'answer': <string>}", is_error=True)
            self._grade(answer)
            return ToolResult("graded", done=True)
        return ToolResult(f"no tool {name!r}", is_error=True)

    def end_turn(self, response: str) -> Turn | None:
        self._turns_left -= 1
        if self._turns_left > 0:
            return self._turn()
        self._grade(response)
        return None

    @property
    def done(self) -> bool:
        return self._done

    def scores(self) -> dict[str, float]:
        return dict(self._scores)

    def close(self) -> None:
        """Leave a marker file, so tests can see the episode was torn down."""
        if self._marker_dir:
            path = Path(self._marker_dir) / f"closed-{self.info.task_id}-{os.getpid()}-{id(self)}"
            path.write_text("closed")


class EchoBundle(Bundle):
    """`train` and `eval` splits of echo tasks."""

    name = "echo"
    version = "1"

    def __init__(
        self,
        train: int = 3,
        eval: int = 2,
        turns: int = 1,
        marker_dir: str | None = None,
        extra_scores: bool = False,
        inline: bool = False,
    ) -> None:
        if turns < 1:
            raise ValueError(f"turns must be at least 1, not {turns}")
        self._splits = {"train": train, "eval": eval}
        self.turns = turns
        self.marker_dir = marker_dir
        self.extra_scores = extra_scores
        # Its `sleep` tool blocks, so by default its episodes run on worker threads; the speed benchmark,
        # which never sleeps, plays them inline as openenv's server plays a sync env's steps.
        self.inline_episodes = inline

    def splits(self) -> dict[str, int]:
        return dict(self._splits)

    def task_info(self, split: str, index: int) -> TaskInfo:
        n = self._splits[split]  # KeyError for an unknown split
        if not 0 <= index < n:
            raise IndexError(f"split {split!r} has {n} tasks")
        return TaskInfo(task_id=f"echo-{split}-{index}", split=split, index=index)

    def episode(self, split: str, index: int) -> Episode:
        return EchoEpisode(self.task_info(split, index), self.turns, self.marker_dir, self.extra_scores)

    def spec(self) -> dict[str, Any]:
        return {
            "bundle": "echo",
            "train": self._splits["train"],
            "eval": self._splits["eval"],
            "turns": self.turns,
            "marker_dir": self.marker_dir,
            "extra_scores": self.extra_scores,
            "inline": self.inline_episodes,
        }
