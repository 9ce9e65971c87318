"""A LoRA run's final model in MLflow: the adapter folder as a logged model, with a reference to its base.

MLflow's transformers flavor would copy the base's weights beside a PEFT adapter whose base is a local folder
(it keeps only a Hugging Face Hub id as a reference), so the adapter is logged as plain files instead: the
logged model's artifacts are the adapter and tokenizer, its tag `agentrl.lora_base` the base model's folder.
docs/models.md ("LoRA") gives the merge command that makes a full model of the two.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from agentrl.tracking.limits import TAG_VALUE_CHARS

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"  # PEFT's (agentrl.models.lora_folder; tracking imports no models)
BASE_TAG = "agentrl.lora_base"


def is_adapter(folder: Path) -> bool:
    """True for a LoRA adapter folder (PEFT's `adapter_config.json`)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def log_adapter(client: Any, experiment_id: str, run_id: str, folder: Path, name: str) -> str | None:
    """Log adapter folder `folder` as run `run_id`'s model `name`; returns the logged model's id, or None (with a
    warning) when it could not be logged: a run must not fail at its very end over this."""
    from mlflow.entities import LoggedModelStatus
    from mlflow.exceptions import MlflowException

    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as err:
        log.warning("model %s not logged to MLflow: its %s is unreadable (%s)", folder, ADAPTER_CONFIG, err)
        return None
    base = str(config.get("base_model_name_or_path") or "")
    tags = {"agentrl.model_dir": str(folder)[:TAG_VALUE_CHARS], BASE_TAG: base[:TAG_VALUE_CHARS],
            "agentrl.lora_rank": str(config.get("r")), "agentrl.lora_alpha": str(config.get("lora_alpha"))}
    logged = client.create_logged_model(experiment_id, name=name, source_run_id=run_id, tags=tags)
    try:
        client.log_model_artifacts(logged.model_id, str(folder))
    except (OSError, MlflowException) as err:
        log.warning("model %s not logged to MLflow: %s: %s", folder, type(err).__name__, err)
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        return None
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return logged.model_id
