"""The rubric nodes a `reward=rubric` tree is made of: OpenEnv's rubric classes (`openenv.core.rubrics`, RFC 004),
with the leaves that read an agentrl episode and containers whose parts have names (each named part is a metric).

A rubric is called as OpenEnv calls one, `rubric(action, observation)`: the action is the rollout's answer, the
observation its `Graded` record (task prompt, answer, the env's named scores).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from openenv.core.rubrics import Gate as _Gate
from openenv.core.rubrics import Rubric
from openenv.core.rubrics import Sequential as _Sequential
from openenv.core.rubrics import WeightedSum as _WeightedSum

from agentrl.config.reward import FormatNodeConfig, GateNodeConfig, ScoreNodeConfig, ThresholdNodeConfig
from agentrl.rewards import RewardError


class MissingScore(RewardError):
    """The episode did not score what a `Score` names."""


@dataclass
class Graded:
    """What a rubric reads of one rollout (OpenEnv's `observation`); `parts` collects each named part's value."""

    prompt: str
    answer: str
    scores: Mapping[str, float]
    parts: dict[str, float] = field(default_factory=dict)


class Score(Rubric):
    """The env's score named `name` (null: the episode's one score)."""

    def __init__(self, name: str | None = ScoreNodeConfig.name) -> None:
        super().__init__()
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name={name!r}: a score's name is a non-empty string (or null: the one score)")
        self.name = name

    def forward(self, action: Any, observation: Graded) -> float:
        scores = observation.scores
        if self.name is None:
            if len(scores) != 1:
                raise MissingScore(f"Score() takes the episode's one score, but it scored {sorted(scores)}; "
                                   "name one: Score(name=...)")
            return float(next(iter(scores.values())))
        if self.name not in scores:
            raise MissingScore(f"no score named {self.name!r}; the episode scored {sorted(scores)}")
        return float(scores[self.name])


class Format(Rubric):
    """1 when the answer matches the regular expression `pattern` (anywhere; the whole answer with `full`), else 0."""

    def __init__(self, pattern: str, full: bool = FormatNodeConfig.full) -> None:
        super().__init__()
        try:
            self.regex = re.compile(pattern, re.DOTALL)
        except (re.error, TypeError) as exc:
            raise ValueError(f"pattern={pattern!r} is not a regular expression: {exc}") from None
        self.full = bool(full)

    def forward(self, action: Any, observation: Graded) -> float:
        text = str(action or "").strip()
        return 1.0 if (self.regex.fullmatch(text) if self.full else self.regex.search(text)) else 0.0


def _named(parts: Any, where: str) -> dict[str, Rubric]:
    if not isinstance(parts, Mapping) or not parts:
        raise ValueError(f"{where}: a mapping of part name -> rubric node, got {parts!r}")
    for name, part in parts.items():
        if not isinstance(part, Rubric):
            raise ValueError(f"{where}.{name}: not a rubric node (give it a _target_ under agentrl.rubrics), "
                             f"got {part!r}")
    return {str(k): v for k, v in parts.items()}


class WeightedSum(_WeightedSum):
    """OpenEnv's `WeightedSum` of named parts: `weights` maps each part's name to a finite weight >= 0, summing
    to 1 (OpenEnv's rule)."""

    def __init__(self, parts: Mapping[str, Rubric], weights: Mapping[str, float]) -> None:
        named = _named(parts, "parts")
        if not isinstance(weights, Mapping):
            raise ValueError(f"weights: a mapping of part name -> weight, got {weights!r}")
        if extra := sorted(set(map(str, weights)) - set(named)):
            raise ValueError(f"weights.{extra[0]}: no part has that name; the parts are {sorted(named)}")
        if missing := [n for n in named if n not in weights]:
            raise ValueError(f"weights.{missing[0]} is not set: every part needs a weight")
        values = {}
        for name in named:
            w = weights[name]
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ValueError(f"weights.{name}={w!r}: a weight is a finite number >= 0")
            values[name] = float(w)
        if abs(sum(values.values()) - 1.0) > 1e-6:
            raise ValueError(f"weights sum to {sum(values.values()):g}, not 1 ({values}): OpenEnv's WeightedSum "
                             "takes normalized weights")
        super().__init__(list(named.values()), list(values.values()))
        self.parts = named


class Sequential(_Sequential):
    """OpenEnv's `Sequential` of named parts, in order: 0 as soon as one scores 0, else the last one's score."""

    def __init__(self, parts: Mapping[str, Rubric]) -> None:
        named = _named(parts, "parts")
        super().__init__(*named.values())
        self.parts = named


class Gate(_Gate):
    """OpenEnv's `Gate`: the child's score when it reaches `threshold`, else 0."""

    def __init__(self, rubric: Rubric, threshold: float = GateNodeConfig.threshold) -> None:
        if not isinstance(rubric, Rubric):
            raise ValueError(f"rubric: not a rubric node, got {rubric!r}")
        super().__init__(rubric, float(threshold))


class Threshold(Rubric):
    """`above` when the child reaches `threshold`, else `below`; a score the child lacks counts as below (so
    `reward=asymmetric` is `Threshold(Score(), 1.0, above=1.2, below=0.8)` of a judged play's outcome)."""

    def __init__(self, rubric: Rubric, threshold: float = ThresholdNodeConfig.threshold,
                 above: float = ThresholdNodeConfig.above, below: float = ThresholdNodeConfig.below) -> None:
        super().__init__()
        if not isinstance(rubric, Rubric):
            raise ValueError(f"rubric: not a rubric node, got {rubric!r}")
        for key, value in (("threshold", threshold), ("above", above), ("below", below)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key}={value!r}: a finite number")
        self.rubric, self.threshold, self.above, self.below = rubric, float(threshold), float(above), float(below)

    def forward(self, action: Any, observation: Any) -> float:  # the sync path of __call__, for OpenEnv's API
        return self(action, observation)

    def _pick(self, score: float) -> float:
        return self.above if score >= self.threshold else self.below

    def __call__(self, action: Any, observation: Any) -> Any:
        self._run_forward_pre_hooks(action, observation)
        try:
            score = self.rubric(action, observation)
        except MissingScore:
            return self._finish_forward(action, observation, self.below)
        if inspect.iscoroutine(score):
            return self._call_child_async(action, observation, score)
        return self._finish_forward(action, observation, self._pick(score))

    async def _call_child_async(self, action: Any, observation: Any, pending: Any) -> float:
        try:
            score = await pending
        except MissingScore:
            return await self._finish_forward_async(action, observation, self.below)
        return await self._finish_forward_async(action, observation, self._pick(score))


def config_nodes(node: Rubric, key: str) -> Iterator[tuple[str, str | None, Rubric]]:
    """(config key, metric name or None, node) of `node` and every node below it: a container's parts are named
    (`<key>.parts.<name>`, metric `<outer>.<name>`), a wrapper's child (`<key>.rubric`) is not."""
    yield from _walk(node, key, None, "")


def _walk(node: Rubric, key: str, name: str | None, prefix: str) -> Iterator[tuple[str, str | None, Rubric]]:
    yield key, name, node
    inner = name or prefix  # a wrapper (Gate, Threshold) passes its own name on to its child's parts
    for part, child in (getattr(node, "parts", None) or {}).items():
        yield from _walk(child, f"{key}.parts.{part}", f"{inner}.{part}" if inner else part, "")
    child = getattr(node, "rubric", None)
    if isinstance(child, Rubric):
        yield from _walk(child, f"{key}.rubric", None, inner)
