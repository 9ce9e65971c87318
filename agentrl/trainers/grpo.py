"""`trainer=grpo`: group-relative policy optimization on one machine.

A step reads top to bottom (`_train_step`): draw rows -> play them (`RolloutRunner`: agent, reward group) ->
filter groups (`agentrl.rewards.group_drop_reason`) -> advantages and one AdamW step per trained policy
(`policies.step_policies`) -> push each policy's weights to its engine. The policies are one list: the shared
`main` (from the warm start, `warm_start.py`) and a policy per role model (`policies.py`).

Setup (`_setup`): the start folder, the policies and their learners, the engine + session server + env server
(`services.py`), and on resume the checkpoint's state. Train (`fit`): evaluations before the first step, every
`eval_every` steps and at the end (plus a greedy-decoded one). Cleanup: the final model logged, the reward
curve PNG, and the services stopped whatever happened.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from agentrl.agents.base import multi_agent_metrics
from agentrl.agents.record import Rollout
from agentrl.console import progress
from agentrl.devices import set_threads, train_device
from agentrl.group_filter import FAILED, FailureStreak, failure_cause, group_drop_reason
from agentrl.trainers import checkpoint as ckpt
from agentrl.trainers.evaluate import step_line, trainer_eval
from agentrl.trainers.health import HealthWatch
from agentrl.trainers.no_update import NoUpdateWatch
from agentrl.trainers.plots import reward_curves
from agentrl.trainers.policies import MAIN, Policy, load_learners, main_policy, plan_policies, step_policies
from agentrl.trainers.resume import AGENTRL, checkpoint_record
from agentrl.trainers.rollout import make_row
from agentrl.trainers.services import start_services
from agentrl.trainers.warm_start import warm_start_path

log = logging.getLogger(__name__)


class RowStream:
    """Train-row indices: a fresh seeded permutation every epoch, read through a cursor (saved in checkpoints)."""

    def __init__(self, count: int, seed: int, cursor: int = 0) -> None:
        self.count, self.seed, self.cursor = count, seed, cursor
        self._epoch, self._order = -1, []

    def next(self) -> int:
        epoch, pos = divmod(self.cursor, self.count)
        if epoch != self._epoch:
            self._order = list(range(self.count))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        self.cursor += 1
        return self._order[pos]


def fill_step(draw: Callable[[], int], play: Callable[[list[int], int], list[list[Rollout]]], *, want: int,
              budget: int, drop: Callable[[list[Rollout]], str | None]
              ) -> tuple[list[list[Rollout]], list[Rollout], Counter[str], int]:
    """Draw and play rows until `want` groups pass the filter (`drop` returns None) or `budget` rows were drawn.

    Returns (kept groups, every rollout played, dropped groups by reason, rows drawn). Each round draws only as
    many rows as groups are still missing, so a step never trains on more than `want` groups.
    """
    kept: list[list[Rollout]] = []
    seen: list[Rollout] = []
    dropped: Counter[str] = Counter()
    drawn = attempt = 0
    while len(kept) < want and drawn < budget:
        indices = [draw() for _ in range(min(want - len(kept), budget - drawn))]
        drawn += len(indices)
        for group in play(indices, attempt):
            seen += group
            reason = drop(group)
            if reason is None:
                kept.append(group)
            else:
                dropped[reason] += 1
        attempt += 1
    return kept, seen, dropped, drawn


def checkpoint_root(cfg: DictConfig, run_id: str | None) -> Path:
    """`trainer.checkpoint_path`, else `<paths.checkpoint_dir>/<task_name>/<run id>`."""
    if cfg.trainer.get("checkpoint_path"):
        return Path(cfg.trainer.checkpoint_path)
    return Path(cfg.paths.checkpoint_dir) / cfg.task_name / (run_id or "no-run")


def rollout_metrics(seen: list[Rollout]) -> dict[str, float]:
    """A step's rollout metrics: train reward, flagged shares by failure, invalid calls, model tokens."""
    n = max(len(seen), 1)
    flagged = Counter(r.failure.value for r in seen if r.failure is not None)
    metrics = {"train/reward": sum(r.reward for r in seen) / n, "rollout/flagged": sum(flagged.values()) / n,
               "rollout/invalid_tool_calls": sum(r.invalid_calls for r in seen) / n,
               "rollout/model_tokens": float(sum(r.model_tokens for r in seen))}
    metrics.update({f"rollout/flagged/{k}": v / n for k, v in flagged.items()})
    if any(r.role != "agent" for r in seen):
        metrics.update(multi_agent_metrics(seen))
    return metrics


def weight_lag(played: list[Rollout], engine: Any) -> dict[str, float]:
    """`rollout/weight_lag`: how many weight versions behind the engine's current one the shared policy's
    trained turns were sampled (0 when played then trained; about 1 with `off_policy_steps=1`)."""
    now = getattr(engine, "weight_version", None)
    versions = [v for r in played if r.policy == MAIN and r.sample is not None
                for v in r.sample.metadata.get("weight_versions", ()) if v is not None]
    return {"rollout/weight_lag": now - sum(versions) / len(versions)} if now is not None and versions else {}


class GRPOTrainer:
    """The built-in GRPO trainer (see the module docstring for the step)."""

    checkpoint_kind = AGENTRL  # what trainer.resume resolves to at plan time (resume.py): step-NNNNNN/state.pt

    def __init__(self, cfg: DictConfig, *, plan: Any, tracker: Any) -> None:
        self.cfg, self.plan, self.tracker = cfg, plan, tracker
        self.t = cfg.trainer
        if int(self.t.samples_per_prompt) < 2:
            raise ValueError("trainer.samples_per_prompt must be at least 2: GRPO compares samples within a group")
        # One policy per distinct role model (checked here, so a bad path fails before any setup); the shared
        # policy `main` joins them in _setup, once its start folder is known.
        self.policies: list[Policy] = plan_policies(cfg.agent.get("roles"))
        self.history: dict[str, list[tuple[int, float]]] = {"train/reward": [], "eval/reward": []}
        self.streak = FailureStreak(int(self.t.max_drops_in_a_row))
        self.times: Counter[str] = Counter()  # wall seconds: warm_start, train, eval
        self.health = HealthWatch(cfg.agent.get("health"))  # the recipe's healthy ranges, judged at the end
        self.no_update = NoUpdateWatch(penalize=self.t.model_failures == "drop")  # steps that trained nothing
        # off_policy_steps=1: the next step's collection, played on one background thread while this step trains
        self.prefetcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-rollouts")
        self.ahead: concurrent.futures.Future | None = None
        self.saved_cursor = 0

    @property
    def main(self) -> Policy:
        return next(p for p in self.policies if p.name == MAIN)

    @property
    def learner(self) -> Any:
        """The shared policy's learner (its model and optimizer)."""
        return self.main.learner

    @property
    def tokenizer(self) -> Any:
        return self.main.tokenizer

    # ------------------------------------------------------------------ setup

    def _setup(self) -> int:
        """Build everything; returns the first step to run (1, or the step after the resumed checkpoint)."""
        cfg, t = self.cfg, self.t
        torch.manual_seed(int(cfg.seed))
        random.seed(int(cfg.seed))
        self.root = checkpoint_root(cfg, self.tracker.run_id)
        # The plan resolved and checked trainer.resume (latest, a run id or a folder); None: a fresh start.
        resume_from = getattr(getattr(self.plan, "resume", None), "checkpoint", None)
        self.record = checkpoint_record(cfg, getattr(self.plan, "choices", {}), self.tracker.run_id)
        started = time.monotonic()
        start_path = str(resume_from / "model") if resume_from else warm_start_path(cfg, self.plan, self.tracker)
        self.times["warm_start"] += time.monotonic() - started
        self.policies = [main_policy(start_path), *(p for p in self.policies if p.name != MAIN)]
        # After the warm start: SFT's large batches want every core, the rollout loop may want fewer.
        threads = set_threads(cfg)
        device = train_device(cfg)
        log.info("GRPO: learner on %s, %d torch CPU threads", device, threads)
        for p in self.policies:  # a trained role model resumes from the checkpoint's copy
            if resume_from and p.trainable and p.name != MAIN:
                p.path = str(ckpt.policy_path(resume_from, p.name))
        load_learners(t, self.policies, device, cfg.model)
        self.rows = RowStream(self.plan.bundle.splits()[cfg.env.train_split], int(cfg.seed))
        first = 1
        if resume_from is not None:
            first = self._restore(resume_from)
        self.services = start_services(cfg, self.plan, start_path, self.policies)
        return first

    def _restore(self, checkpoint: Path) -> int:
        """Optimizers, data cursor, history and RNG from `checkpoint`; returns the step after it."""
        state = ckpt.load_state(checkpoint)
        saved = {MAIN: state["optimizer"], **state.get("policy_optimizers", {})}
        for p in self.policies:
            if p.learner is not None:
                if p.name not in saved:
                    raise ckpt.CheckpointError(f"checkpoint {checkpoint} holds no optimizer for policy "
                                               f"{p.name!r} (it has {sorted(saved)}); resume with its roles")
                p.learner.optimizer.load_state_dict(saved[p.name])
        self.rows.cursor = int(state["row_cursor"])
        self.history = state.get("history", self.history)
        ckpt.set_rng_state(state["rng"])
        print(f"resuming from {checkpoint} at step {int(state['step']) + 1}", flush=True)
        return int(state["step"]) + 1

    # ------------------------------------------------------------------ train

    def _drop(self, group: list[Rollout]) -> str | None:
        """The group filter, and the failure streak that stops a run whose rollouts all fail."""
        reason = group_drop_reason(group, drop_no_signal=bool(self.t.drop_no_signal),
                                   penalize_model_failures=self.t.model_failures == "penalize")
        self.streak.record(reason, failure_cause(group) if reason == FAILED else "")
        return reason

    def _collect(self, step: int) -> tuple[list[list[Rollout]], dict[str, float]]:
        """Play rows until `prompts_per_step` groups pass the filter (or the extra-row budget runs out)."""
        t, bundle, svc = self.t, self.plan.bundle, self.services
        want, budget = int(t.prompts_per_step), int(t.prompts_per_step) + int(t.max_extra_rows)

        def play(indices: list[int], attempt: int) -> list[list[Rollout]]:
            rows = [make_row(bundle, self.cfg.env.train_split, i, svc.env_url, svc.env_settings) for i in indices]
            return asyncio.run(svc.runner.play_rows(rows, int(t.samples_per_prompt),
                                                    request_kwargs=self.plan.sampling.request_kwargs(),
                                                    seed_parts=(self.cfg.seed, step, attempt)))

        started = time.monotonic()
        kept, seen, dropped, drawn = fill_step(self.rows.next, play, want=want, budget=budget, drop=self._drop)
        if svc.runner.breaker is not None:  # the console hears of a step that mostly failed
            svc.runner.breaker.step_done(step, seen)
        metrics = rollout_metrics(seen)
        metrics["time/generate_s"] = time.monotonic() - started
        metrics.update({"rollout/groups_dropped": float(sum(dropped.values())), "rollout/rows_drawn": float(drawn),
                        "rollout/groups_kept": float(len(kept))})
        metrics.update({f"rollout/groups_dropped/{k}": float(v) for k, v in dropped.items()})
        return kept, metrics

    def _update(self, played: list[Rollout], step: int | None = None) -> tuple[dict[str, float], float]:
        """One AdamW step per trained policy on the samples it played, each pushed to its own engine.

        Returns the train metrics (`train/*` for main, `train/<policy>/*` for role models) and the push seconds.
        """
        return step_policies(self.policies, played, self.services.policy_engines, step)

    def _train_step(self, step: int) -> dict[str, float]:
        """One step. With `off_policy_steps=1` the next step's rollouts are played while this one trains: they
        start on this step's weights (one version stale when trained); the step then waits only for what
        generation did not hide (`time/generate_wait_s`)."""
        t0 = time.monotonic()
        ahead, self.ahead = self.ahead, None
        groups, metrics = ahead.result() if ahead is not None else self._collect(step)
        t1 = time.monotonic()
        self.saved_cursor = self.rows.cursor  # a checkpoint of this step resumes from here, not past the prefetch
        if int(self.t.off_policy_steps) and step < int(self.t.steps):
            self.ahead = self.prefetcher.submit(self._collect, step + 1)
        played = [r for g in groups for r in g]
        metrics.update(weight_lag(played, self.services.engine))
        update, push_s = self._update(played, step)
        metrics.update(update)
        t2 = time.monotonic() - push_s
        metrics.update({"time/generate_wait_s": t1 - t0, "time/train_s": t2 - t1, "time/weight_push_s": push_s,
                        "time/step_s": time.monotonic() - t0,
                        "perf/generate_tokens_per_s": metrics["rollout/model_tokens"] / max(metrics["time/generate_s"],
                                                                                           1e-9),
                        "perf/train_tokens_per_s": metrics.get("train/tokens", 0.0) / max(t2 - t1, 1e-9)})
        self.history["train/reward"].append((step, metrics["train/reward"]))
        metrics.update(self.plan.bundle.metrics())  # the bundle's own state, e.g. env/level
        return metrics

    def _settle(self) -> None:
        """Let rollouts played ahead finish (kept for the next step): an eval or the shutdown gets a quiet engine."""
        if self.ahead is not None:
            concurrent.futures.wait([self.ahead])

    def _evaluate(self, step: int, *, greedy: bool = False) -> dict[str, float]:
        self._settle()
        return trainer_eval(self.services, self.plan.bundle, self.cfg, step, sampling=self.plan.sampling,
                            greedy=greedy, times=self.times,
                            history=self.history)

    def _save(self, step: int) -> None:
        others = [p for p in self.policies if p.learner is not None and p.name != MAIN]
        state = {"optimizer": self.learner.optimizer.state_dict(), "row_cursor": self.saved_cursor,
                 "run_id": self.tracker.run_id, "history": self.history,
                 "policy_optimizers": {p.name: p.learner.optimizer.state_dict() for p in others}}
        ckpt.save(self.root, step, model=self.learner.model, tokenizer=self.tokenizer, state=state,
                  keep=int(self.t.keep_checkpoints), policies={p.name: (p.learner.model, p.tokenizer) for p in others},
                  record=self.record)

    def fit(self) -> dict[str, float]:
        """Train for `trainer.steps` steps; returns the final metrics (their `eval/reward` is the objective)."""
        from tqdm import tqdm

        t = self.t
        steps, eval_every, ckpt_every = int(t.steps), int(t.eval_every), int(t.checkpoint_every)
        first = self._setup()
        final: dict[str, float] = {}
        try:
            if first == 1:
                self.tracker.log(self._evaluate(0), step=0)
            bar = tqdm(range(first, steps + 1), initial=first - 1, total=steps, desc="grpo", dynamic_ncols=True)
            for step in bar:
                started = time.monotonic()
                metrics = self._train_step(step)
                self.times["train"] += time.monotonic() - started
                if step == steps or (eval_every and step % eval_every == 0):
                    metrics.update(self._evaluate(step))
                self.tracker.log(metrics, step=step)
                progress(step_line("grpo", step, steps, metrics))  # the log file's step progress
                self.health.add(metrics)
                self.no_update.add(step, metrics)
                if ckpt_every and (step % ckpt_every == 0 or step == steps):
                    self._save(step)
                bar.set_postfix(reward=f"{metrics['train/reward']:.3f}",
                                eval=f"{self.history['eval/reward'][-1][1]:.3f}")
                final = metrics
            greedy = self._evaluate(steps, greedy=True)
            self.tracker.log(greedy, step=steps)
            final.update(greedy)
            if "eval/reward" not in final and self.history["eval/reward"]:
                final["eval/reward"] = self.history["eval/reward"][-1][1]
            final.update({f"time/{k}_total_s": v for k, v in self.times.items()})
            health = self.health.metrics()
            if summary := self.health.summary():  # only when the recipe declares ranges (agent.health)
                print(summary, flush=True)
            if health:
                self.tracker.log(health, step=steps)
            final.update(health)
            if no_update := self.no_update.metrics():
                self.tracker.log(no_update, step=steps)
                final.update(no_update)
            self._log_final_model()
        finally:
            if self.services.runner.breaker is not None:  # plays waiting for a dead dependency give up now
                self.services.runner.breaker.abandoned.set()
            self._settle()  # its plays need the services; a failure in them is moot once the run has ended
            self.prefetcher.shutdown()
            self.services.close()
            self._plot()
        return final

    # ------------------------------------------------------------------ cleanup

    def _log_final_model(self) -> None:
        """The trained shared policy, as a Hugging Face folder in the run folder and a logged model in MLflow."""
        folder = Path(self.plan.run_dir) / "final_model"
        self.learner.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        self.tracker.log_model(folder)

    def _plot(self) -> None:
        try:
            run_dir = Path(self.plan.run_dir)
            path = reward_curves(self.history, run_dir / "reward_curves.png", title=self.cfg.task_name)
            self.tracker.log_artifact(path, "plots")
        except Exception:  # noqa: BLE001 - a missing figure must not fail a finished run
            log.exception("could not draw the reward curves")
