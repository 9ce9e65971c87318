"""`python -m agentrl eval [overrides]`: play a model on a bundle's tasks, several samples each, and log the
result as an evaluation run (no training): mean ± se, pass@k, the bundle's breakdown, per-task results.

The same config groups as training (`model=`, `env=`, `agent=`, `inference=`, recipes) and the `eval` node
(agentrl/config/evaluation.py). docs/evaluation.md says how to read the result.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict
from tqdm import tqdm

from agentrl.config.sampling import Sampling
from agentrl.models.lora_folder import is_model_folder
from agentrl.plan import Plan
from agentrl.play.dependency_breaker import DependencyLost
from agentrl.play.eval_results import EvalSink
from agentrl.play.eval_subset import eval_subset
from agentrl.play.evaluate import evaluate, failure_note
from agentrl.run import dataset_ref, engine_unavailable, job_plan
from agentrl.tracking.eval_lookup import RunLookupError, final_model_of, looks_like_run_id, run_tags
from agentrl.tracking.tracker import Tracker

# The tag that marks an MLflow run as an evaluation (training runs lack it).
RUN_KIND_TAG = "agentrl.run_kind"
EVALUATION = "evaluation"


def model_folder(plan: Plan, asked: str | None, tracking_uri: str) -> str:
    """The weights to evaluate: `eval.model` (a folder, or an MLflow run id: its final_model), else the model
    group's (made first if it is built on demand, like the tiny model)."""
    if not asked:
        return plan.model.path()
    if Path(asked).is_dir():
        folder = Path(asked)
        # A checkpoint folder (step-NNNNNN/) holds its weights in model/ (a LoRA run's: its adapter).
        if not is_model_folder(folder) and is_model_folder(folder / "model"):
            folder = folder / "model"
        if not is_model_folder(folder):
            raise SystemExit(f"agentrl eval: eval.model={asked} holds no Hugging Face model (no config.json) "
                             "and no LoRA adapter (no adapter_config.json)")
        return str(folder.resolve())
    if looks_like_run_id(asked):
        try:
            return str(final_model_of(tracking_uri, asked))
        except RunLookupError as err:
            raise SystemExit(f"agentrl eval: eval.model={asked}: {err}") from None
    raise SystemExit(f"agentrl eval: eval.model={asked} is neither a model folder nor an MLflow run id")


def folder_choices(folder: Path) -> dict[str, str]:
    """The config group choices of the run that made model `folder`, when it says: a checkpoint's
    `agentrl_run.json` (the folder, or its `model/`'s parent), or a run folder's Hydra record (its `final_model`);
    {} for a folder of unknown making."""
    from omegaconf import OmegaConf

    for where in (folder, folder.parent):
        record = where / "agentrl_run.json"
        if record.is_file():
            try:
                return {k: str(v) for k, v in json.loads(record.read_text()).get("choices", {}).items() if v}
            except (OSError, ValueError, AttributeError):
                return {}
        hydra = where / ".hydra" / "hydra.yaml"
        if hydra.is_file():
            try:
                choices = OmegaConf.load(hydra).hydra.runtime.choices
                return {k: str(v) for k, v in choices.items() if v and "/" not in k}
            except Exception:  # noqa: BLE001 - a record we cannot read tells us nothing
                return {}
    return {}


def model_tags(asked: str | None, folder: str, tracking_uri: str) -> dict[str, str]:
    """The evaluated model's tags, which replace the ones the recipe's own model group would give the run: its
    `choice.model` (the run that trained it, when known: its MLflow run id, its checkpoint record or its run
    folder; else `hf`, a Hugging Face folder) and `agentrl.eval.model_run` (that run's id, when known). {} when
    `eval.model` is unset: the model group's own model is the one evaluated."""
    if not asked:
        return {}
    tags: dict[str, str] = {}
    if looks_like_run_id(asked):
        tags["agentrl.eval.model_run"] = asked
        model = run_tags(tracking_uri, asked).get("choice.model")
    else:
        model = folder_choices(Path(folder)).get("model")
    tags["choice.model"] = model or "hf"
    return tags


def own_description(overrides: list[str], *, model: str, env: str, split: str, subset: str, samples: int) -> str | None:
    """The description an eval run carries (the recipe's describes its training): None when the command line set
    one (`description=...`)."""
    if any(o.lstrip("+").startswith("description=") for o in overrides):
        return None
    return (f"agentrl eval of {model} on {env} split {split}: {subset}, {samples} sample{'s' * (samples != 1)} "
            "each")


def eval_sampling(plan: Plan, temperature: float | None) -> Sampling:
    """The trainer's sampling (top_p, top_k) at `eval.temperature` when given; 0 decodes greedily."""
    base = plan.sampling
    if base is None:  # a trainer that samples nothing (sft): plain sampling at eval.temperature
        return Sampling(temperature=0.0 if temperature is None else temperature, top_p=1.0, top_k=0,
                        greedy=not temperature)
    if temperature is None:
        return base
    return base.greedy_copy() if temperature == 0 else base.at(temperature)


def closing_block(*, status: str, run_dir: Path, tracker: Tracker, metrics: dict[str, float], subset: str,
                  samples: int, results: Path | None, wall_s: float) -> str:
    """The block an evaluation ends with: where it is, what it scored (the env's grade ± se, the reward group's
    eval/reward when it differs, tool calls, failures, pass@k, maj@k, breakdown) and on which tasks (`subset`)."""
    lines = [f"== agentrl eval {status} in {wall_s:.0f} s", f"run folder    {run_dir}"]
    if tracker.run_id:
        lines.append(f"MLflow        {tracker.tracking_uri}  experiment {tracker.experiment}  run {tracker.run_id}")
        lines.append(f"browse        {tracker.ui_command()}")
        if url := tracker.url():
            lines.append(f"              then {url}")
    on = f"({subset} x {samples} sample{'s' * (samples != 1)})"
    if "eval/grade" in metrics:
        lines.append(f"eval/grade    {metrics['eval/grade']:.4f} ± {metrics['eval/grade_stderr']:.4f} {on} "
                     "(the environment's own grade)")
    graded = "eval/grade" in metrics
    if "eval/reward" in metrics and (not graded or abs(metrics["eval/reward"] - metrics["eval/grade"]) > 1e-9):
        what = "(the reward group's score, shaped)" if graded else on
        lines.append(f"eval/reward   {metrics['eval/reward']:.4f} ± {metrics['eval/reward_stderr']:.4f} {what}")
    if "eval/tool_call_rate" in metrics:
        lines.append(f"tool calls    {metrics['eval/tool_call_rate']:.0%} of plays made a valid tool call "
                     f"({metrics['eval/tool_calls_per_play']:.2f} a play)")
    if "eval/failure_share" in metrics:
        lines.append(f"failures      {failure_note(metrics) or 'none'}")
    if passes := [f"pass@{k[13:]} {v:.3f}" for k, v in metrics.items() if k.startswith("eval/pass_at_")]:
        lines.append(f"pass@k        {', '.join(passes)}")
    if majority := [f"maj@{k[12:]} {v:.4f}" for k, v in metrics.items() if k.startswith("eval/maj_at_")]:
        lines.append(f"majority      {', '.join(majority)} (the score of each task's most common answer)")
    skip = {"eval/reward", "eval/reward_stderr", "eval/zero_share"}
    if parts := [f"{k[5:]} {v:.3f}" for k, v in sorted(metrics.items())
                 if k.startswith(("eval/reward_", "eval/reward/")) and k not in skip]:
        lines.append(f"breakdown     {', '.join(parts)}")
    if results is not None:
        lines.append(f"per-task      {results} (and in MLflow: evals/; the eval table evals/eval_table.json)")
    return "\n".join(lines)


def run_eval(cfg: DictConfig) -> float | None:
    """Evaluate one model as `cfg.eval` says; returns eval/reward (None if it failed)."""
    started = time.monotonic()
    plan = job_plan(cfg, "agentrl eval")
    hydra_cfg = HydraConfig.get()
    choices, run_dir = plan.choices, plan.run_dir
    e, tracker = plan.settings.eval, plan.tracker
    split = e.split or plan.settings.env.eval_split
    if split not in plan.bundle.splits():
        raise SystemExit(f"agentrl eval: eval.split={split}: bundle {plan.bundle.name} has no such split; it has "
                         f"{sorted(plan.bundle.splits())}")
    model = model_folder(plan, e.model, tracker.tracking_uri)
    from agentrl.play.policies import plan_policies  # torch loads only once the plan is checked

    # Roles with a model of their own play it here as in training (agent.roles.<i>.model; the plan checked it).
    policies = plan_policies(plan.settings.agent.role_list())
    sampling = eval_sampling(plan, e.temperature)
    subset = eval_subset(plan.bundle, split, e.limit)
    overrides = list(hydra_cfg.overrides.task)
    if description := own_description(overrides, model=e.model or f"model={choices.get('model')}",
                                       env=str(choices.get("env")), split=split, subset=subset.note,
                                       samples=e.samples):
        with open_dict(cfg):
            cfg.description = description
    tracker.start(cfg, choices=choices, run_dir=run_dir, overrides=overrides)
    tracker.set_tags({RUN_KIND_TAG: EVALUATION, "agentrl.eval.model": model, "agentrl.eval.split": split,
                      "agentrl.eval.samples": e.samples, "agentrl.eval.subset": subset.note,
                      **model_tags(e.model, model, tracker.tracking_uri)})
    bundle = plan.bundle
    tracker.log_datasets([dataset_ref(bundle, "eval", split)])
    print(f"evaluating   {model}\non           {choices.get('env')} ({bundle.name}) split {split}: {subset.note} x "
          f"{e.samples} samples, agent {choices.get('agent')}, inference {choices.get('inference')}\n"
          f"sampling     {sampling.request_kwargs()}", flush=True)
    for policy in policies:
        print(f"role model   {', '.join(policy.roles)}: {policy.source}", flush=True)
    status, metrics, sink = "FAILED", {}, EvalSink(tracker, run_dir)
    from agentrl.play.services import start_services  # torch loads only once the plan is checked

    try:
        services = start_services(plan, model, policies)
        services.runner.traces = tracker  # every eval play is traced, as in training's evals
        try:
            with tqdm(total=len(subset.indices), desc="eval", unit="task", dynamic_ncols=True) as bar:
                metrics, _ = evaluate(services, bundle, split, limit=e.limit, sampling=sampling,
                                      seed_parts=(plan.settings.seed,), samples=e.samples, pass_score=e.pass_score,
                                      sink=sink, progress=bar)
        finally:
            services.close()
        tracker.log(metrics, step=0)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except (DependencyLost, engine_unavailable()) as err:
        raise SystemExit(f"agentrl eval: {err}") from None
    finally:
        tracker.finish(status)
        print(closing_block(status=status, run_dir=run_dir, tracker=tracker, metrics=metrics, subset=subset.note,
                            samples=e.samples, results=sink.last, wall_s=time.monotonic() - started), flush=True)
    return metrics.get("eval/reward")


