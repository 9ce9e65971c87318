"""The `eval` node: what `python -m agentrl eval` plays (training's own evals read `trainer.eval_*`)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EvalConfig:
    # Plays of each task; with more than one, pass@k for k <= samples is reported.
    samples: int = 1
    # The sampling temperature (0: greedy-decoded); None: the trainer's (trainer.temperature).
    temperature: float | None = None
    # The split played; None: env.eval_split.
    split: str | None = None
    # `limit` tasks of the split, stratified as the bundle declares (play/eval_subset.py); None: all of them.
    limit: int | None = None
    # The weights: a model folder (a run's final_model, a checkpoint's model, any Hugging Face folder) or an
    # MLflow run id (its final_model); None: the model group's own (model=tiny, model=hf model.path=...).
    model: str | None = None
    # A sample passes (for pass@k) when its grade (the env's own) reaches this.
    pass_score: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"eval.samples must be an integer >= 1, got {self.samples!r}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"eval.limit must be >= 1 (or null: every task), got {self.limit!r}")
        if not (isinstance(self.pass_score, int | float) and math.isfinite(self.pass_score)):
            raise ValueError(f"eval.pass_score must be a finite number, got {self.pass_score!r}")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"eval.temperature must be a finite number >= 0 (0: greedy-decoded), "
                             f"got {self.temperature!r}")
