"""What `agentrl eval` and `agentrl compare` read back from an MLflow store by run id: a run's folder (its
final_model) and its per-task eval results."""

from __future__ import annotations

import re
from pathlib import Path

RUN_DIR_TAG = "agentrl.run_dir"  # set by MLflowTracker.start
EVALS_DIR = "evals"  # the artifact folder the per-task results go to (play/eval_results.py)
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class RunLookupError(LookupError):
    """A run id that names nothing usable in the store (the message says what and where)."""


def looks_like_run_id(text: str) -> bool:
    """An MLflow run id's shape: 32 lowercase hex digits."""
    return bool(RUN_ID.match(text))


def _run(tracking_uri: str, run_id: str):  # noqa: ANN202 - an MLflow Run
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        return client, client.get_run(run_id)
    except MlflowException as exc:
        raise RunLookupError(f"run {run_id} is not in the MLflow store {tracking_uri} ({exc.message[:200]}); point "
                           "MLFLOW_TRACKING_URI at the store it was logged to") from None


def final_model_of(tracking_uri: str, run_id: str) -> Path:
    """The `final_model` folder in run `run_id`'s run folder (its `agentrl.run_dir` tag)."""
    _, run = _run(tracking_uri, run_id)
    run_dir = run.data.tags.get(RUN_DIR_TAG)
    if not run_dir:
        raise RunLookupError(f"run {run_id} has no {RUN_DIR_TAG} tag: it was not logged by an agentrl run")
    folder = Path(run_dir) / "final_model"
    # A LoRA run's final model is its adapter (adapter_config.json names the base model).
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise RunLookupError(f"run {run_id}: {folder} holds no saved model (a run that trained to the end saves one)")
    return folder


def _step(name: str) -> int:
    match = re.search(r"-step-(\d+)\.jsonl$", name)
    return int(match.group(1)) if match else -1


def eval_results_of(tracking_uri: str, run_id: str, dest: Path) -> Path:
    """Download run `run_id`'s per-task eval results into `dest`: an `agentrl eval` run's `evals/eval.jsonl`,
    else a training run's last sampled eval (`evals/eval-step-<n>.jsonl`, the highest n)."""
    client, _ = _run(tracking_uri, run_id)
    names = [Path(a.path).name for a in client.list_artifacts(run_id, EVALS_DIR) if a.path.endswith(".jsonl")]
    sampled = [n for n in names if n == "eval.jsonl" or n.startswith("eval-step-")]
    if not sampled:
        raise RunLookupError(f"run {run_id} logged no per-task eval results ({EVALS_DIR}/*.jsonl); evaluate it with "
                           "`agentrl eval eval.model=<its run id>`")
    name = "eval.jsonl" if "eval.jsonl" in sampled else max(sampled, key=_step)
    dest.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, f"{EVALS_DIR}/{name}", str(dest)))


def run_tags(tracking_uri: str, run_id: str) -> dict[str, str]:
    """Run `run_id`'s tags (its `choice.<group>` among them)."""
    _, run = _run(tracking_uri, run_id)
    return dict(run.data.tags)
