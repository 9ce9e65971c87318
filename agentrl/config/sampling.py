"""How the policy samples: one value, built once by the plan from the trainer's settings (`Plan.sampling`).

Training, the trainers' evals and the warm start's evals all send `Sampling.request_kwargs()`, so an eval
"at the training temperature" samples exactly as training does (top_p and top_k included).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# What every chat request carries besides the sampling knobs: templates that think (Qwen3) are told not to, so a
# rollout's tokens are the reply and its tool calls only.
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}


class SamplingError(ValueError):
    """A sampling setting no engine could honour (the message names the setting)."""


@dataclass(frozen=True)
class Sampling:
    """temperature (0: greedy), top_p in (0, 1] (1: off), top_k >= 0 (0: off); `greedy` decodes greedily
    whatever the temperature (the greedy-decoded evals)."""

    temperature: float
    top_p: float
    top_k: int
    greedy: bool = False

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise SamplingError(f"sampling {name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise SamplingError(f"sampling temperature must be >= 0 (0: greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"sampling top_p must be in (0, 1] (1: off), got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError(f"sampling top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        if not isinstance(self.greedy, bool):
            raise SamplingError(f"sampling greedy must be true or false, got {self.greedy!r}")

    def greedy_copy(self) -> Sampling:
        """The same settings decoded greedily (temperature 0 on the wire)."""
        return dataclasses.replace(self, greedy=True)

    def at(self, temperature: float) -> Sampling:
        """The same top_p and top_k at another temperature (sampled, not greedy)."""
        return dataclasses.replace(self, temperature=temperature, greedy=False)

    def request_kwargs(self) -> dict[str, Any]:
        """The sampling part of an OpenAI chat request to the session server; top_k only when it is on."""
        kwargs: dict[str, Any] = {"temperature": 0.0 if self.greedy else float(self.temperature),
                                  "top_p": float(self.top_p), "chat_template_kwargs": dict(CHAT_TEMPLATE_KWARGS)}
        if self.top_k > 0:
            kwargs["top_k"] = self.top_k
        return kwargs
