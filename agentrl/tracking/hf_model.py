"""A run's final model in MLflow as a Hugging Face folder, through MLflow's transformers flavor.

The logged model appears under the run's "Logged models" and in its experiment, its files beside the run's
artifacts. (A LoRA run's adapter goes through agentrl/tracking/adapter_model.py instead.)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from agentrl.interrupts import held
from agentrl.tracking.limits import TAG_VALUE_CHARS

log = logging.getLogger(__name__)


def log_hf_model(client: Any, tracking_uri: str, experiment_id: str, run_id: str, model_dir: Path,
                 name: str) -> str | None:
    """Log Hugging Face folder `model_dir` as run `run_id`'s model `name` (client: the run's MlflowClient); returns
    the logged model's id. A missing optional dependency of the flavor, or a folder it cannot read, warns and
    returns None: a run must not fail at its very end over this."""
    try:
        import mlflow
        import mlflow.transformers
        import torch
        import transformers
        from mlflow.entities import LoggedModelStatus
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        log.warning("model not logged to MLflow: its transformers flavor needs %s (pip install it)", err.name)
        return None
    # Made here, in this run's experiment: the fluent API would put it in the process's active experiment.
    logged = client.create_logged_model(
        experiment_id, name=name, source_run_id=run_id,
        tags={"agentrl.model_dir": str(model_dir)[:TAG_VALUE_CHARS]})
    try:
        # Objects, not the folder's path: MLflow 3.17's checkpoint-path route fails with transformers 5.
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        # Stated requirements: MLflow would otherwise infer them by loading the model in a subprocess.
        requirements = [f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}"]
        # The fluent API reads the process-wide tracking URI; point it at this run's store only meanwhile.
        # MLflow's context manager drops $MLFLOW_TRACKING_URI on the way out: a sweep's next job would then
        # log to the default store, so the variable is put back as it was.
        saved = os.environ.get("MLFLOW_TRACKING_URI")
        # The flavor warns that a local folder has no Hub model card or license: true and of no use here.
        flavor_log = logging.getLogger("mlflow.transformers")
        level = flavor_log.level
        flavor_log.setLevel(logging.ERROR)
        try:
            with _use_tracking_uri(tracking_uri), held():
                mlflow.transformers.log_model(
                    {"model": model, "tokenizer": tokenizer}, name=name, task="text-generation",
                    run_id=run_id, model_id=logged.model_id, pip_requirements=requirements)
        finally:
            flavor_log.setLevel(level)
            if saved is not None:
                os.environ["MLFLOW_TRACKING_URI"] = saved
    except ImportError as err:
        log.warning("model not logged to MLflow: its transformers flavor needs %s (pip install it)", err.name)
    except (OSError, ValueError, TypeError, mlflow.exceptions.MlflowException) as err:
        log.warning("model %s not logged to MLflow: %s: %s", model_dir, type(err).__name__, err)
    else:
        return logged.model_id
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
    return None
