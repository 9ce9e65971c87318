"""The Miles backend (`trainer=miles`): the trainer (`trainer.py`), Miles' command line (`args.py`, `lora.py`),
the process Miles runs in (`launcher.py`, `python -m agentrl.trainers.miles.launcher`), and the hooks Miles
imports by dotted path inside its Ray workers (`hooks.py`, `rubric.py`).

`MilesTrainer` is reachable as `agentrl.trainers.miles.MilesTrainer`, the `_target_` that conf/trainer/miles.yaml and the
schema name (and that every checkpoint's `agentrl_run.json` records, which a resume compares); it is loaded
only when asked for, so importing one of this package's modules does not load the trainer.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "MilesTrainer":
        from agentrl.trainers.miles.trainer import MilesTrainer

        return MilesTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
