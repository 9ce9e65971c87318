"""The TRL backend (`trainer=trl`): the trainer that launches the ranks (`trainer.py`), what each rank runs
(`worker.py`, entered through `agentrl.trl_rank`), TRL's `GRPOConfig` from ours (`args.py`) and the step our
rollouts make inside TRL's loop (`steps.py`).

`TRLTrainer` is reachable as `agentrl.trainers.trl.TRLTrainer`, the `_target_` that conf/trainer/trl.yaml and the
schema name (and that every checkpoint's `agentrl_run.json` records, which a resume compares); it is loaded
only when asked for, so importing one of this package's modules does not load the trainer.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "TRLTrainer":
        from agentrl.trainers.trl.trainer import TRLTrainer

        return TRLTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
