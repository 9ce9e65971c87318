"""`trainer=grpo`: group-relative policy optimization on one machine.

A step (`train_step`) is six verbs: draw rows -> play them (`RolloutRunner`: agent, reward group) -> filter the
groups (`agentrl.group_filter`; dropped groups are replaced by new rows, `step_fill.fill_step`) -> advantages
-> update (one AdamW step per trained policy) -> push each policy's weights to its engine (`policy_steps.py`). The
first three make a `StepBatch`, played ahead (`play_ahead.py`); the step reports a `StepStats`.

How the default (`conf/trainer/grpo.yaml` over `GRPOTrainerConfig`) departs from vanilla GRPO (DeepSeekMath):
- One step off-policy (`max_staleness=1`): step n+1 is played while step n trains, so its plays start on the
  weights step n trained from (`rollout/weight_lag` about 1). `max_staleness=0` plays each step on the newest;
  K >= 2 plays up to K steps ahead, kept within K by `stale_policy` (wait | pace | drop: `play_ahead.py`).
- Truncated importance sampling (`tis_cap=2`): the ratio is taken against the learner's own logprob at the
  step's start, each token weighted by min(learner / engine probability, 2), which corrects that staleness and
  the engine's numeric difference from the learner (`grpo_math.py`).
- One optimizer step per batch (no PPO epochs), no reference model and no KL penalty (`kl_coef=0`).
- The loss `grpo` is token-level (summed over the step's model tokens, divided by their count: DAPO's
  normalization, not a per-sample mean), clipped at 0.2 / 0.2; advantages `group_norm`, (r - mean) / std.
- Groups that teach nothing are dropped, not trained at zero advantage: all rewards equal (`drop_no_signal`) or
  a failed rollout (`model_failures=drop`); new rows replace them, up to `max_extra_rows` more a step.

Setup: the start folder (the warm start, `warm_start.py`, or a resumed checkpoint), the policies (the shared
`main` and a policy per role model, `play/policies.py`) and their learners, the engine + session server + env server
(`services.py`). `fit()`: evaluations before the first step, every `eval_every` steps and at the end (plus a
greedy-decoded one), checkpoints every `checkpoint_every`. Cleanup: the services stopped and the reward curves
drawn, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from agentrl.agents.record import Rollout
from agentrl.config.schema import RunConfig, trainer_settings
from agentrl.config.trainer import GRPOTrainerConfig
from agentrl.console import progress
from agentrl.devices import release_freed_memory, set_threads, train_device
from agentrl.group_filter import FAILED, FailureStreak, failure_cause, group_drop_reason
from agentrl.interrupts import between_steps, stop_point
from agentrl.play.episode_traces import TraceAs
from agentrl.play.eval_results import EvalSink
from agentrl.play.evaluate import step_line, trainer_eval
from agentrl.play.policies import MAIN, Policy, main_policy, plan_policies
from agentrl.play.rollout import make_row
from agentrl.play.services import start_services
from agentrl.trainers.common.no_update import NoUpdateWatch
from agentrl.trainers.common.plots import reward_curves
from agentrl.trainers.common.protocol import TrainerBase
from agentrl.trainers.common.resume import AGENTRL, checkpoint_record, checkpoint_root
from agentrl.trainers.common.rollout_metrics import tail_seconds, weight_lag
from agentrl.trainers.common.step_fill import RowStream, fill_step
from agentrl.trainers.common.step_products import StepBatch, StepStats, StepTimes
from agentrl.trainers.grpo import checkpoint as ckpt
from agentrl.trainers.grpo.health import HealthWatch
from agentrl.trainers.grpo.play_ahead import PlayAhead
from agentrl.trainers.grpo.policy_steps import (
    advantages,
    load_learners,
    partial_rollouts_problem,
    push_policies,
    update_policies,
)
from agentrl.trainers.grpo.role_advantages import role_advantage_problem
from agentrl.trainers.grpo.staleness import STALE, EngineIdle, play_staleness, split_stale, staleness_metrics
from agentrl.trainers.sft.warm_start import warm_start_path

log = logging.getLogger(__name__)


class GRPOTrainer(TrainerBase):
    """The built-in GRPO trainer (see the module docstring for the step)."""

    checkpoint_kind = AGENTRL  # what trainer.resume resolves to at plan time (resume.py): step-NNNNNN/state.pt

    @classmethod
    def plan_problem(cls, settings: RunConfig) -> str | None:
        """`advantage=hierarchical`'s `episode_roles` must be roles the agent plays (`role_advantages.py`);
        `trainer.partial_rollouts` needs the embedded engine."""
        return role_advantage_problem(settings) or partial_rollouts_problem(settings)

    def __init__(self, *, plan: Any, tracker: Any) -> None:
        self.plan, self.tracker = plan, tracker
        self.settings: RunConfig = plan.settings  # the typed config: what this trainer reads
        self.t = t = trainer_settings(self.settings, GRPOTrainerConfig)
        if t.samples_per_prompt < 2:
            raise ValueError("trainer.samples_per_prompt must be at least 2: GRPO compares samples within a group")
        # One policy per distinct role model (checked here, so a bad path fails before any setup); the shared
        # policy `main` joins them in setup, once its start folder is known. Only multi-role patterns have roles.
        self.policies: list[Policy] = plan_policies(self.settings.agent.role_list())
        self.history: dict[str, list[tuple[int, float]]] = {"train/reward": [], "eval/reward": []}
        self.streak = FailureStreak(t.max_drops_in_a_row)
        # wall seconds: warm_start, engine_start, train, eval
        self.times: defaultdict[str, float] = defaultdict(float)
        self.health = HealthWatch(self.settings.agent.health)  # the recipe's healthy ranges, judged at the end
        self.no_update = NoUpdateWatch(penalize=t.model_failures == "drop")  # steps that trained nothing
        self.ready: PlayAhead[StepBatch] | None = None  # the step batches, played one ahead (setup)
        self.services: Any = None
        self.trained_cursor = 0  # the row cursor after the last trained step's draws: what a checkpoint saves

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

    def setup(self, plan: Any) -> int:
        """Build everything `plan` asks for; returns the first step to run (1, or the one after the checkpoint)."""
        self.plan, s = plan, self.settings
        torch.manual_seed(s.seed)
        random.seed(s.seed)
        self.root = checkpoint_root(s, self.tracker.run_id)
        # The plan resolved and checked trainer.resume (latest, a run id or a folder); None: a fresh start.
        resume_from = plan.resume.checkpoint if plan.resume is not None else None
        self.record = checkpoint_record(plan, self.tracker.run_id)
        started = time.monotonic()
        start_path = str(resume_from / "model") if resume_from else warm_start_path(plan, self.tracker)
        if not resume_from and self.t.warm_start.enabled:  # the closing block names only the stages that ran
            self.times["warm_start"] += time.monotonic() - started
        release_freed_memory()  # a warm start made here freed its model and optimizer: give them back
        self.policies = [main_policy(start_path), *(p for p in self.policies if p.name != MAIN)]
        # After the warm start: SFT's large batches want every core, the rollout loop may want fewer.
        threads = set_threads(s)
        device = train_device(s)
        log.info("GRPO: learner on %s, %d torch CPU threads", device, threads)
        for p in self.policies:  # a trained role model resumes from the checkpoint's copy
            if resume_from and p.trainable and p.name != MAIN:
                p.path = str(ckpt.policy_path(resume_from, p.name))
        load_learners(self.t, self.policies, device, model_cfg=s.model)
        self.rows = RowStream(plan.bundle.splits()[s.env.train_split], s.seed)
        first = self._restore(resume_from) if resume_from is not None else 1
        self.trained_cursor = self.rows.cursor
        self.services = start_services(plan, start_path, self.policies)
        self.times["engine_start"] += self.services.start_s
        self.services.runner.traces = plan.tracker  # episode traces: every eval play, a sample of training's
        self.ready = PlayAhead(self._play_step, first=first, last=self.t.steps, max_staleness=self.t.max_staleness,
                               policy=self.t.stale_policy)
        self.engine_idle = EngineIdle(self.services.engine, time.monotonic)
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
                # advantage=rae's per-role baselines go on from where they were (absent: they start at 0)
                p.learner.baselines.baselines = dict(state.get("rae_baselines", {}).get(p.name, {}))
        self.rows.cursor = int(state["row_cursor"])
        self.history = state.get("history", self.history)
        ckpt.set_rng_state(state["rng"])
        print(f"resuming from {checkpoint} at step {int(state['step']) + 1}", flush=True)
        return int(state["step"]) + 1

    # ------------------------------------------------------------------ the step

    def train_step(self, step: int) -> StepStats:
        """One step: its plays (draw -> play -> filter, made ahead under max_staleness >= 1, while the previous
        steps trained), then advantages -> update -> push. Waits only for what the plays did not hide."""
        if self.ready is None or step != self.ready.step:  # the plays ahead belong to the next step in order
            raise RuntimeError(f"GRPOTrainer.train_step({step}): steps run in order from the one setup(plan) "
                               f"returned; the next is {self.ready.step if self.ready else 'after setup'}")
        began = time.monotonic()
        batch = next(self.ready)  # rows = draw(); groups = play(rows); kept = filter(groups)
        waited = time.monotonic()
        lag = weight_lag(batch.played, self.services.engine.weight_version)  # before this step's push
        staleness = self._staleness(batch)
        samples = advantages(self.policies, batch.trained)
        update = update_policies(samples, step)
        updated = time.monotonic()
        push_s = push_policies(samples, self.services.policy_engines)
        release_freed_memory(collect=False)  # the update's activations: freed, still resident (GBs for a real model)
        self.trained_cursor = batch.row_cursor  # a checkpoint of this step resumes here, not past the next plays
        times = StepTimes(generate_wait_s=waited - began, train_s=updated - waited, weight_push_s=push_s,
                          step_s=time.monotonic() - began)
        extra = {**lag, **self.plan.bundle.metrics(), **self.plan.reward.metrics()}  # reward: an LLM judge's judge/*
        extra.update(self._async_metrics(step, batch, staleness, times))
        # Under LoRA (push=adapter) only the adapter goes: the base is never re-sent.
        extra["time/weight_push_bytes"] = float(sum(p.learner.pushed_bytes for p, items in samples if items))
        stats = StepStats(step, batch, update, times, extra=extra)
        self.history["train/reward"].append((step, stats.reward))
        return stats

    def _staleness(self, batch: StepBatch) -> dict[str, float]:
        """`async/staleness_*` of what trains; under stale_policy=drop, the groups older than K leave `batch.kept`
        first (counted in `rollout/groups_dropped/stale` and `async/dropped_stale`)."""
        now = {name: engine.weight_version for name, engine in self.services.policy_engines.items()}
        plays = play_staleness(batch.played, now)
        stale: list[Any] = []
        if self.t.stale_policy == "drop":
            batch.kept, stale = split_stale(batch.kept, now, self.t.max_staleness, plays)
            if stale:
                batch.dropped[STALE] += len(stale)
        return staleness_metrics(batch.trained, plays, dropped_groups=len(stale))

    def _async_metrics(self, step: int, batch: StepBatch, staleness: dict[str, float],
                       times: StepTimes) -> dict[str, float]:
        """The step's `async/*` metrics: staleness, what the bound held back, learner / producer / engine idle."""
        assert self.ready is not None
        held = self.ready.held_s(step)
        metrics = {**staleness, "async/held_s": held, "async/held_stale": float(batch.rows_drawn if held > 0 else 0),
                   "async/learner_idle": times.generate_wait_s / max(times.step_s, 1e-9)}
        if (producer := self.ready.producer_idle()) is not None:
            metrics["async/producer_idle"] = producer
        if (engine := self.engine_idle.since_last()) is not None:
            metrics["async/engine_idle"] = engine
        return metrics

    def _play_step(self, step: int) -> StepBatch:
        """Draw rows, play them and filter the groups until `prompts_per_step` pass (or `max_extra_rows` more
        rows were drawn): `fill_step`. Runs on the producer thread under max_staleness >= 1."""
        t, s, svc = self.t, self.settings, self.services
        began, version = time.monotonic(), svc.engine.weight_version
        tail = [0.0]  # the step's long-tail seconds, over its play calls

        def play(indices: list[int], attempt: int) -> list[list[Rollout]]:
            rows = [make_row(self.plan.bundle, s.env.train_split, i, svc.env_url, svc.env_settings) for i in indices]
            ends: list[float] = []
            groups = asyncio.run(svc.runner.play_rows(rows, t.samples_per_prompt,
                                                      request_kwargs=self.plan.sampling.request_kwargs(),
                                                      seed_parts=(s.seed, step, attempt),
                                                      trace_as=TraceAs("train", step), ends=ends))
            tail[0] += tail_seconds(ends)
            return groups

        kept, played, dropped, drawn = fill_step(self.rows.next, play, want=t.prompts_per_step,
                                                 budget=t.prompts_per_step + t.max_extra_rows, drop=self._filter)
        if svc.runner.breaker is not None:  # the console hears of a step that mostly failed
            svc.runner.breaker.step_done(step, played)
        return StepBatch(step, kept, played, dropped, drawn, row_cursor=self.rows.cursor, played_from=version,
                         generate_s=time.monotonic() - began, tail_s=tail[0],
                         breakdown=dict(self.plan.bundle.train_breakdown))

    def _filter(self, group: list[Rollout]) -> str | None:
        """The group filter, and the failure streak that stops a run whose rollouts all fail."""
        reason = group_drop_reason(group, drop_no_signal=self.t.drop_no_signal,
                                   penalize_model_failures=self.t.model_failures == "penalize")
        self.streak.record(reason, failure_cause(group) if reason == FAILED else "")
        return reason

    # ------------------------------------------------------------------ the run

    def evaluate(self, step: int, *, greedy: bool = False) -> dict[str, float]:
        """The eval split at `step` (sampled as training samples, or greedy-decoded), once the plays ahead end."""
        if self.ready is not None:
            self.ready.settle()
        return trainer_eval(self.services, self.plan.bundle, self.settings, step, sampling=self.plan.sampling,
                            greedy=greedy, times=self.times, history=self.history,
                            sink=EvalSink(self.tracker, Path(self.plan.run_dir)))

    def save(self, step: int) -> None:
        """A checkpoint of `step`: every trained policy's model and optimizer, the row cursor, the history."""
        others = [p for p in self.policies if p.learner is not None and p.name != MAIN]
        state = {"optimizer": self.learner.optimizer.state_dict(), "row_cursor": self.trained_cursor,
                 "run_id": self.tracker.run_id, "history": self.history,
                 "policy_optimizers": {p.name: p.learner.optimizer.state_dict() for p in others},
                 "rae_baselines": {p.name: dict(p.learner.baselines.baselines)
                                   for p in self.policies if p.learner is not None}}
        ckpt.save(self.root, step, model=self.learner.model, tokenizer=self.tokenizer, state=state,
                  keep=self.t.keep_checkpoints, policies={p.name: (p.learner.model, p.tokenizer) for p in others},
                  record=self.record)

    def fit(self) -> dict[str, float]:
        """`setup`, `train_step` for each of `trainer.steps` with evals and checkpoints on their cadence, the
        closing evals, `cleanup`; returns the final metrics (their `eval/reward` is the objective)."""
        first = self.setup(self.plan)
        try:
            # Ctrl-C and SIGTERM stop the loop between steps (agentrl/interrupts.py: raised mid-step, they can
            # strand a lock another thread needs, and the run hangs in its cleanup).
            with between_steps():
                final = self._loop(first)
            final.update(self._closing_metrics())
            self._log_final_model()
        finally:
            self.cleanup()
        return final

    def _loop(self, first: int) -> dict[str, float]:
        """Steps `first`..`trainer.steps` (after the step-0 eval of a fresh run); returns the last step's metrics."""
        from tqdm import tqdm

        t = self.t
        final: dict[str, float] = {}
        if first == 1:
            self.tracker.log(self.evaluate(0), step=0)
        bar = tqdm(range(first, t.steps + 1), initial=first - 1, total=t.steps, desc="grpo", dynamic_ncols=True)
        for step in bar:
            stop_point()
            started = time.monotonic()
            metrics = self.train_step(step).as_metrics()
            self.times["train"] += time.monotonic() - started
            if step == t.steps or (t.eval_every and step % t.eval_every == 0):
                metrics.update(self.evaluate(step))
            self.tracker.log(metrics, step=step)
            progress(step_line("grpo", step, t.steps, metrics))  # the log file's step progress
            self.health.add(metrics)
            self.no_update.add(step, metrics)
            if t.checkpoint_every and (step % t.checkpoint_every == 0 or step == t.steps):
                self.save(step)
            bar.set_postfix(reward=f"{metrics['train/reward']:.3f}",
                            eval=f"{self.history['eval/reward'][-1][1]:.3f}")
            final = metrics
        return final

    def _closing_metrics(self) -> dict[str, float]:
        """After the last step: the greedy-decoded eval, the time totals, the health ranges, the steps without
        an update (each logged at the last step)."""
        steps = self.t.steps
        final = self.evaluate(steps, greedy=True)
        self.tracker.log(final, step=steps)
        if self.history["eval/reward"]:
            final["eval/reward"] = self.history["eval/reward"][-1][1]
        final.update({f"time/{k}_total_s": v for k, v in self.times.items()})
        if summary := self.health.summary():  # only when the recipe declares ranges (agent.health)
            print(summary, flush=True)
        for extra in (self.health.metrics(), self.no_update.metrics()):
            if extra:
                self.tracker.log(extra, step=steps)
                final.update(extra)
        return final

    def closing_lines(self) -> list[str]:
        """The end-of-run block's lines about steps that trained nothing."""
        return self.no_update.closing_lines()

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        """Stop the plays ahead and the services, draw the reward curves; runs whatever happened."""
        if self.services is not None:
            if self.services.runner.breaker is not None:  # plays waiting for a dead dependency give up now
                self.services.runner.breaker.abandoned.set()
            if self.ready is not None:
                self.ready.close()  # its plays need the services; a failure in them is moot once the run ended
            self.services.close()
        self._plot()

    def _log_final_model(self) -> None:
        """The trained shared policy, as a Hugging Face folder in the run folder and a logged model in MLflow."""
        folder = Path(self.plan.run_dir) / "final_model"
        self.learner.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        self.tracker.log_model(folder)

    def _plot(self) -> None:
        try:
            run_dir = Path(self.plan.run_dir)
            path = reward_curves(self.history, run_dir / "reward_curves.png", title=self.settings.task_name)
            self.tracker.log_artifact(path, "plots")
        except Exception:  # noqa: BLE001 - a missing figure must not fail a finished run
            log.exception("could not draw the reward curves")
