"""An episode as a trace, in plain data: what `agentrl.tracking.traces` writes to MLflow Tracing.

Trainers build these from their rollouts (`agentrl.play.episode_traces`) and hand them to
`Tracker.log_traces`; this layer knows no agent types, and this module no MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TracedCall:
    """A tool call: its arguments and the env's answer, or why it was refused (`invalid`)."""

    name: str
    arguments: Any
    answer: str = ""
    invalid: str = ""
    scores: dict[str, float] | None = None  # the env's scores, when the call ended the episode
    start_ns: int = 0
    end_ns: int = 0


@dataclass
class TracedTurn:
    """A model turn: the messages added since the previous reply, the reply (with its reasoning), its calls."""

    request: list[dict[str, Any]]
    reply: dict[str, Any]
    finish_reason: str = ""
    calls: list[TracedCall] = field(default_factory=list)
    invalid: str = ""
    start_ns: int = 0
    end_ns: int = 0


@dataclass
class TracedRole:
    """One role's session of a play: its turns and its outcome (scores, score, trained reward, weight, failure)."""

    role: str
    turns: list[TracedTurn]
    outcome: dict[str, Any]
    failure: str = ""


@dataclass
class EpisodeTrace:
    """One play as a trace: `tags` filter it in the UI (step, split, task_id, policy_version)."""

    name: str
    task: dict[str, Any]  # split, index, task id
    roles: list[TracedRole]
    tags: dict[str, str]
    outcome: dict[str, Any] = field(default_factory=dict)  # the play's final scores and rewards

    @property
    def failed(self) -> bool:
        return any(r.failure for r in self.roles)
