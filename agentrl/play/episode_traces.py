"""A finished play as an episode trace (`agentrl.tracking.traces.EpisodeTrace`), and which plays are traced.

Every eval play is traced; a training play is, when its stable draw falls under the tracker's
`trace_train_fraction` (`logger.trace_train_fraction`), so a rerun traces the same plays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.agents.record import Rollout, Turn
from agentrl.tracking.trace_record import EpisodeTrace, TracedCall, TracedRole, TracedTurn


@dataclass(frozen=True)
class TraceAs:
    """What the plays of one `play_rows` call are, for their traces: the split ("train", "eval", ...) and step."""

    split: str
    step: int

    @property
    def sampled(self) -> bool:
        """Training plays are traced by sample; every other play is traced."""
        return self.split == "train"


def traced(trace_as: TraceAs, fraction: float, key: tuple[Any, ...], j: int) -> bool:
    """Whether play `j` of row `key` is traced: always outside training, else with probability `fraction`."""
    if not trace_as.sampled:
        return True
    if fraction <= 0:
        return False
    digest = hashlib.sha256("/".join(map(str, ("trace", trace_as.step, *key, j))).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


def _turn(turn: Turn) -> TracedTurn:
    calls = [TracedCall(c.name, c.arguments, answer=c.answer, invalid=c.invalid, scores=c.scores, start_ns=c.start_ns,
                        end_ns=c.end_ns) for c in turn.calls]
    return TracedTurn(turn.request, turn.reply, turn.finish_reason, calls, turn.invalid, turn.start_ns, turn.end_ns)


def _outcome(r: Rollout) -> dict[str, Any]:
    """A role's result as the trace shows it: the env's scores, the episode's score, the trained reward and its
    weight, the failure, and the counts."""
    out: dict[str, Any] = {"scores": dict(r.scores or {}), "score": r.score, "reward": r.reward, "weight": r.weight,
                           "turns": r.turns, "tool_calls": r.tool_calls, "invalid_calls": r.invalid_calls,
                           "answer": r.answer, "frozen": r.frozen}
    if r.failure is not None:
        out.update(failure=r.failure.value, error=r.error)
    if r.details:
        out["details"] = {k: v for k, v in r.details.items() if isinstance(v, str | int | float | bool)}
    return out


def _version(rollouts: Sequence[Rollout]) -> str:
    """The weight version(s) that sampled the play's tokens ("" when the engine reported none)."""
    versions = sorted({str(v) for r in rollouts if r.sample is not None
                       for v in r.sample.metadata.get("weight_versions", ()) if v is not None})
    return ",".join(versions)


def episode_trace(rollouts: Sequence[Rollout], row: dict[str, Any], j: int, trace_as: TraceAs) -> EpisodeTrace:
    """The trace of one play (its rewarded, recorded rollouts: one per role) of `row`."""
    meta = row.get("metadata") or {}
    task_id = str(meta.get("task_id") or f"{meta.get('split')}/{meta.get('index')}")
    task = {"task_id": task_id, "split": meta.get("split"), "index": meta.get("index"), "play": j}
    roles = [TracedRole(r.role, [_turn(t) for t in r.transcript], _outcome(r),
                        r.failure.value if r.failure is not None else "") for r in rollouts]
    outcome = {"score": {r.role: r.score for r in rollouts}, "reward": {r.role: r.reward for r in rollouts}}
    tags = {"step": str(trace_as.step), "split": trace_as.split, "task_id": task_id,
            "policy_version": _version(rollouts), "roles": ",".join(r.role for r in rollouts),
            "failed": str(any(r.failure is not None for r in rollouts)).lower()}
    return EpisodeTrace(f"{trace_as.split} step {trace_as.step} {task_id}", task, roles, tags, outcome)
