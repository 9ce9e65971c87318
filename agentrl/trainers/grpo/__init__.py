"""The built-in GRPO backend (`trainer=grpo`): the trainer (`trainer.py`), its loss and advantage math
(`grpo_math.py`, `role_advantages.py`), the learner and each policy's update and push (`learner.py`,
`policy_steps.py`, `lr_schedules.py`), play-ahead and staleness (`play_ahead.py`, `staleness.py`), its
checkpoints (`checkpoint.py`) and the run's health summary (`health.py`).

`GRPOTrainer` is reachable as `agentrl.trainers.grpo.GRPOTrainer`, the `_target_` that conf/trainer/grpo.yaml and the
schema name (and that every checkpoint's `agentrl_run.json` records, which a resume compares); it is loaded
only when asked for, so importing one of this package's modules does not load the trainer.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":
        from agentrl.trainers.grpo.trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
