"""`RubricReward`, the `reward=rubric` group: an episode's score is an OpenEnv rubric tree of the rollout (its
answer, the task's prompt, the env's named scores), and a judged play's weight a rubric of its outcome.

The tree is evaluated once per unflagged rollout in `prepare` (awaiting its LLM judges, many plays at once); each
named part's value is kept on the rollout (`Rollout.rubric`) for the `train/rubric/*` and `eval/rubric/*` metrics.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any

from openenv.core.rubrics import Rubric

from agentrl.agents.record import Failure, Play, Rollout
from agentrl.config.reward import RubricRewardConfig
from agentrl.rewards import RewardError, RewardGroup
from agentrl.rubrics.judge import Judge, JudgeError
from agentrl.rubrics.parts import Graded, Score, config_nodes

TOTAL = "total"  # Rollout.rubric's key for the whole tree's value


def task_prompt(row: Mapping[str, Any]) -> str:
    """The row's task as the judge sees it: its last user message."""
    users = [m.get("content") for m in row.get("messages") or () if m.get("role") == "user"]
    return str(users[-1] or "") if users else ""


async def evaluate(rubric: Rubric, view: Graded) -> float:
    """The rubric's value for `view`, whether its nodes are sync or async."""
    value = rubric(view.answer, view)
    if inspect.isawaitable(value):
        value = await value
    return float(value)


def evaluate_now(rubric: Rubric, view: Graded) -> float:
    """The rubric's value without an event loop; a RewardError when a node must await (an LLM judge)."""
    value = rubric(view.answer, view)
    if inspect.isawaitable(value):
        getattr(value, "close", lambda: None)()
        raise RewardError("this rubric awaits an LLM judge: its rewards need the play (reward_play), not the "
                          "scores alone")
    return float(value)


class RubricReward(RewardGroup):
    """`reward=rubric`: `rubric` scores each episode (None: its one score); `weight` (optional) is the factor of a judged play's
    rollouts, a rubric of the play's outcome (co-evolution's selected answer)."""

    def __init__(self, rubric: Rubric | None = RubricRewardConfig.rubric,
                 weight: Rubric | None = RubricRewardConfig.weight) -> None:
        for key, node in (("rubric", rubric), ("weight", weight)):
            if node is not None and not isinstance(node, Rubric):
                raise ValueError(f"{key}: not a rubric node (a _target_ under agentrl.rubrics), got {node!r}")
        rubric = Score() if rubric is None else rubric
        self.rubric, self.weight_rubric = rubric, weight
        self.nodes = list(config_nodes(rubric, "rubric"))
        if weight is not None:
            self.nodes += config_nodes(weight, "weight")
        names = [name for key, name, _ in self.nodes if name is not None and key.startswith("rubric")]
        if TOTAL in names:
            raise ValueError(f"rubric: a part may not be named {TOTAL!r} (the whole rubric's metric)")
        for key, name, node in self.nodes:
            if name is not None and key.startswith("rubric"):
                node.register_forward_hook(_recorder(name))
        self.judges = [n for _, _, n in self.nodes if isinstance(n, Judge)]

    def __repr__(self) -> str:
        parts = [name for key, name, _ in self.nodes if name is not None and key.startswith("rubric")]
        return (f"RubricReward({type(self.rubric).__name__}, parts={parts}, judges={len(self.judges)}, "
                f"weight={type(self.weight_rubric).__name__ if self.weight_rubric else None})")

    def plan_problem(self, bundle: Any) -> str | None:
        """A Score naming something the bundle does not score (when it declares `score_names`), said by its key."""
        names = tuple(bundle.score_names)
        if not names:
            return None
        for key, _, node in self.nodes:
            if not isinstance(node, Score):
                continue
            if node.name is not None and node.name not in names:
                return (f"reward.{key}.name={node.name!r}: bundle {bundle.name} scores no such thing; its scores "
                        f"are {list(names)}")
            if node.name is None and len(names) > 1:
                return (f"reward.{key}: bundle {bundle.name} has several scores {list(names)}; name one "
                        f"(reward.{key}.name=...)")
        return None

    def __call__(self, scores: dict[str, float]) -> float:
        """The rubric on the scores alone (the env server's reward under Miles; rubrics without a judge)."""
        return evaluate_now(self.rubric, Graded("", "", dict(scores)))

    def score_rollout(self, rollout: Rollout) -> float:
        if TOTAL in rollout.rubric:
            return rollout.rubric[TOTAL]
        view = Graded(task_prompt(rollout.row), rollout.answer, dict(rollout.scores or {}))
        total = evaluate_now(self.rubric, view)
        rollout.rubric = {**view.parts, TOTAL: total}
        return total

    async def prepare(self, play: Play, row: Mapping[str, Any]) -> None:
        """Evaluate the tree on every unflagged, scored rollout of the play at once; a judge that gives no score
        flags its rollout `judge_error`, a score the tree lacks `no_reward`."""
        prompt = task_prompt(row)

        async def one(rollout: Rollout) -> None:
            if rollout.failure is not None or rollout.scores is None:
                return
            view = Graded(prompt, rollout.answer, dict(rollout.scores))
            try:
                total = await evaluate(self.rubric, view)
            except JudgeError as exc:
                rollout.flag(Failure.JUDGE_ERROR, str(exc))
                return
            except Exception as exc:  # noqa: BLE001 - the node's own error names what it wanted
                rollout.flag(Failure.NO_REWARD, f"{type(exc).__name__}: {exc}")
                return
            rollout.rubric = {**view.parts, TOTAL: total}

        await asyncio.gather(*(one(r) for r in play.rollouts))

    def play_weight(self, play: Play) -> float:
        """`weight` of the judged play's outcome (1 without one); an outcome it cannot weigh flags every rollout
        `no_reward` (a Threshold counts a missing score as below instead)."""
        if self.weight_rubric is None:
            return 1.0
        holder = next((r for r in play.rollouts if r.holds_outcome), None)
        view = Graded("", holder.answer if holder else "", dict(play.outcome or {}))
        try:
            return evaluate_now(self.weight_rubric, view)
        except Exception as exc:  # noqa: BLE001 - the node's own error names what it wanted
            for rollout in play.rollouts:
                rollout.flag(Failure.NO_REWARD, f"the play's weight: {type(exc).__name__}: {exc}")
            return 1.0

    def metrics(self) -> dict[str, float]:
        """Each judge's counters (`judge/calls`, `judge/calls_per_s`, `judge/cache_hit_rate`, `judge/failures`;
        `judge_<i>/...` for the i-th of several)."""
        out: dict[str, float] = {}
        for i, judge in enumerate(self.judges):
            out.update(judge.stats.metrics("judge" if len(self.judges) == 1 else f"judge_{i}"))
        return out


def _recorder(name: str) -> Any:
    def record(rubric: Rubric, action: Any, observation: Any, result: float) -> None:
        if isinstance(observation, Graded):
            observation.parts[name] = float(result)
    return record

