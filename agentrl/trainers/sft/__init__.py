"""Supervised fine-tuning (`trainer=sft`) and the SFT warm start the GRPO and TRL backends start from: the
trainer and its loop (`trainer.py`), its demonstrations (`demonstrations.py`), a stopped run's state
(`state.py`) and the warm start (`warm_start.py`). It imports no other backend; grpo and trl import it.

`SFTTrainer` is reachable as `agentrl.trainers.sft.SFTTrainer`, the `_target_` that conf/trainer/sft.yaml and the
schema name (and that every checkpoint's `agentrl_run.json` records, which a resume compares); it is loaded
only when asked for, so importing one of this package's modules does not load the trainer.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "SFTTrainer":
        from agentrl.trainers.sft.trainer import SFTTrainer

        return SFTTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
