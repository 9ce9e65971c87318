"""`trainer=grpo`: group-relative policy optimization on one machine.

Setup: the warm start (SFT, made on demand), the policy model and its optimizer, the engine + session
server + env server (`services.py`), and on resume the checkpoint's state. Train: each step draws rows,
plays `samples_per_prompt` rollouts of each at once, drops groups the filter rejects (flagged rollouts,
or groups whose rewards are all equal: no signal) and draws more rows until the step is full, computes
group-normalized advantages, takes one AdamW step per trained policy on that policy's samples and pushes its
weights to its engine (roles may play their own models: `policies.py`). Eval before the
first step, every `eval_every` steps and at the end (plus a greedy-decoded eval). Cleanup: the reward
curve PNG, and the services stopped whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from agentrl.devices import set_threads, train_device
from agentrl.rewards import keep_scored_groups
from agentrl.trainers import checkpoint as ckpt
from agentrl.trainers.evaluate import evaluate
from agentrl.trainers.learner import items_from
from agentrl.trainers.plots import reward_curves
from agentrl.trainers.policies import MAIN, load_learners, make_learner, plan_policies, step_policies
from agentrl.trainers.rollout import Played, make_row
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


def has_signal(group: list[Played]) -> bool:
    """The filter: keep a group with no flagged rollout and at least two different rewards."""
    samples = [{"metadata": {**p.metadata, "reward": p.reward}, "reward": p.reward} for p in group]
    return keep_scored_groups(None, samples) and len({p.reward for p in group}) > 1


def fill_step(draw: Callable[[], int], play: Callable[[list[int], int], list[list[Played]]], *, want: int,
              budget: int, keep: Callable[[list[Played]], bool]) -> tuple[list[list[Played]], list[Played], int, int]:
    """Draw and play rows until `want` groups pass `keep` or `budget` rows were drawn.

    Returns (kept groups, every rollout played, groups dropped, rows drawn). Each round draws only as
    many rows as groups are still missing, so a step never trains on more than `want` groups.
    """
    kept: list[list[Played]] = []
    seen: list[Played] = []
    drawn = dropped = attempt = 0
    while len(kept) < want and drawn < budget:
        indices = [draw() for _ in range(min(want - len(kept), budget - drawn))]
        drawn += len(indices)
        for group in play(indices, attempt):
            seen += group
            if keep(group):
                kept.append(group)
            else:
                dropped += 1
        attempt += 1
    return kept, seen, dropped, drawn


def checkpoint_root(cfg: DictConfig, run_id: str | None) -> Path:
    """`trainer.checkpoint_path`, else `<paths.checkpoint_dir>/<task_name>/<run id>`."""
    if cfg.trainer.get("checkpoint_path"):
        return Path(cfg.trainer.checkpoint_path)
    return Path(cfg.paths.checkpoint_dir) / cfg.task_name / (run_id or "no-run")


class GRPOTrainer:
    """The built-in GRPO trainer (see the module docstring for the step)."""

    def __init__(self, cfg: DictConfig, *, plan: Any, tracker: Any) -> None:
        self.cfg, self.plan, self.tracker = cfg, plan, tracker
        self.t = cfg.trainer
        if int(self.t.samples_per_prompt) < 2:
            raise ValueError("trainer.samples_per_prompt must be at least 2: GRPO compares samples within a group")
        # The shared policy plus one per distinct role model; checked here so a bad path fails before any setup.
        self.policies = plan_policies(cfg.agent.get("roles"))
        self.history: dict[str, list[tuple[int, float]]] = {"train/reward": [], "eval/reward": []}

    @classmethod
    def resume_run_id(cls, cfg: DictConfig) -> str | None:
        """The MLflow run id of the newest checkpoint of this task (None: nothing to resume)."""
        roots = [Path(cfg.trainer.checkpoint_path)] if cfg.trainer.get("checkpoint_path") else \
            [p for p in (Path(cfg.paths.checkpoint_dir) / cfg.task_name).glob("*") if p.is_dir()]
        found = [(path.stat().st_mtime, path) for root in roots if (path := ckpt.latest(root)) is not None]
        if not found:
            return None
        return ckpt.load_state(max(found)[1]).get("run_id")

    # ------------------------------------------------------------------ setup

    def _setup(self) -> int:
        """Build everything; returns the first step to run (1, or the step after the resumed checkpoint)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg, t = self.cfg, self.t
        torch.manual_seed(int(cfg.seed))
        random.seed(int(cfg.seed))
        self.root = checkpoint_root(cfg, self.tracker.run_id)
        resume_from = ckpt.latest(self.root) if t.resume else None
        if t.resume and resume_from is None:
            log.warning("trainer.resume=true but no checkpoint under %s: starting fresh", self.root)
        start_path = str(resume_from / "model") if resume_from else warm_start_path(cfg, self.plan, self.tracker)
        # After the warm start: SFT's large batches want every core, the rollout loop may want fewer.
        threads = set_threads(cfg)
        self.tokenizer = AutoTokenizer.from_pretrained(start_path)
        device = train_device(cfg)
        log.info("GRPO: learner on %s, %d torch CPU threads", device, threads)
        model = AutoModelForCausalLM.from_pretrained(start_path, dtype=torch.float32).eval().to(device)
        self.learner = make_learner(t, model, self.tokenizer)
        for p in self.policies:  # a trained role model resumes from the checkpoint's copy
            p.path = str(ckpt.policy_path(resume_from, p.name)) if resume_from and p.trainable else p.source
        load_learners(t, self.policies, device)
        bundle = self.plan.bundle
        self.rows = RowStream(bundle.splits()[cfg.env.train_split], int(cfg.seed))
        first = 1
        if resume_from is not None:
            state = ckpt.load_state(resume_from)
            self.learner.optimizer.load_state_dict(state["optimizer"])
            saved = state.get("policy_optimizers", {})
            for p in self.policies:
                if p.learner is not None:
                    if p.name not in saved:
                        raise ckpt.CheckpointError(f"checkpoint {resume_from} holds no optimizer for policy "
                                                   f"{p.name!r} (it has {sorted(saved)}); resume with its roles")
                    p.learner.optimizer.load_state_dict(saved[p.name])
            self.rows.cursor = int(state["row_cursor"])
            self.history = state.get("history", self.history)
            ckpt.set_rng_state(state["rng"])
            first = int(state["step"]) + 1
            print(f"resuming from {resume_from} at step {first}", flush=True)
        self.services = start_services(cfg, self.plan, start_path, self.policies)
        return first

    # ------------------------------------------------------------------ train

    def _request_kwargs(self, temperature: float) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"temperature": temperature, "top_p": float(self.t.top_p),
                                  "chat_template_kwargs": {"enable_thinking": False}}
        if int(self.t.top_k) > 0:
            kwargs["top_k"] = int(self.t.top_k)
        return kwargs

    def _collect(self, step: int) -> tuple[list[list[Played]], dict[str, float]]:
        """Play rows until `prompts_per_step` groups pass the filter (or the extra-row budget runs out)."""
        t, bundle, svc = self.t, self.plan.bundle, self.services
        want, budget = int(t.prompts_per_step), int(t.prompts_per_step) + int(t.max_extra_rows)

        def play(indices: list[int], attempt: int) -> list[list[Played]]:
            rows = [make_row(bundle, self.cfg.env.train_split, i, svc.env_url, svc.env_settings) for i in indices]
            return asyncio.run(svc.runner.play_rows(rows, int(t.samples_per_prompt),
                                                    request_kwargs=self._request_kwargs(float(t.temperature)),
                                                    seed_parts=(self.cfg.seed, step, attempt)))

        kept, seen, dropped, drawn = fill_step(self.rows.next, play, want=want, budget=budget, keep=has_signal)
        flagged: dict[str, int] = {}
        for p in seen:
            if p.failure:
                reason = str(p.failure).split(":")[0]
                flagged[reason] = flagged.get(reason, 0) + 1
        metrics = {"train/reward": sum(p.reward for p in seen) / max(len(seen), 1),
                   "rollout/groups_dropped": float(dropped), "rollout/rows_drawn": float(drawn),
                   "rollout/flagged": sum(flagged.values()) / max(len(seen), 1),
                   "rollout/invalid_tool_calls": sum(p.invalid_tool_calls for p in seen) / max(len(seen), 1),
                   "rollout/model_tokens": float(sum(p.model_tokens for p in seen))}
        metrics.update({f"rollout/flagged/{k}": v / max(len(seen), 1) for k, v in flagged.items()})
        if any(p.role != "agent" for p in seen):
            from agentrl.agents.base import RolloutOutput, multi_agent_metrics

            metrics.update(multi_agent_metrics(
                RolloutOutput("", p.role, p.reward, p.metadata, str(p.group[-1])) for p in seen))
        return kept, metrics

    def _evaluate(self, step: int) -> dict[str, float]:
        started = time.monotonic()
        metrics, _ = evaluate(self.services, self.plan.bundle, self.cfg.env.eval_split, limit=self.t.eval_limit,
                              temperature=float(self.t.temperature), top_p=float(self.t.top_p),
                              seed_parts=(self.cfg.seed, step))
        metrics["time/eval_s"] = time.monotonic() - started
        self.history["eval/reward"].append((step, metrics["eval/reward"]))
        return metrics

    def _train_step(self, step: int) -> dict[str, float]:
        t0 = time.monotonic()
        groups, metrics = self._collect(step)
        t1 = time.monotonic()
        update, push_s = self._update([p for g in groups for p in g])
        metrics.update(update)
        t2 = time.monotonic() - push_s
        metrics.update({"time/generate_s": t1 - t0, "time/train_s": t2 - t1, "time/weight_push_s": push_s,
                        "time/step_s": time.monotonic() - t0, "rollout/groups_kept": float(len(groups)),
                        "perf/generate_tokens_per_s": metrics["rollout/model_tokens"] / max(t1 - t0, 1e-9),
                        "perf/train_tokens_per_s": metrics.get("train/tokens", 0.0) / max(t2 - t1, 1e-9)})
        self.history["train/reward"].append((step, metrics["train/reward"]))
        return metrics

    def _update(self, played: list[Played]) -> tuple[dict[str, float], float]:
        """One AdamW step per trained policy on the samples it played, each pushed to its own engine.

        Returns the train metrics (`train/*` for main, `train/<policy>/*` for role models) and the push seconds.
        """
        items, _ = items_from(played, policy=MAIN)
        # No group passed the filter: no update this step, and the train metrics say so with zeros.
        metrics = {"train/loss": 0.0, "train/kl": 0.0, "train/clip_fraction": 0.0, "train/approx_kl": 0.0,
                   "train/grad_norm": 0.0, "train/tokens": 0.0}
        metrics.update(self.learner.step(items))
        push_s = self.learner.push(self.services.engine) if items else 0.0
        # Advantages are still computed over the whole groups; each role model steps on its own samples only.
        policy_metrics, policy_push_s = step_policies(self.policies, played, self.services.policy_engines)
        return metrics | policy_metrics, push_s + policy_push_s

    def _save(self, step: int) -> None:
        trained = [p for p in self.policies if p.learner is not None]
        state = {"optimizer": self.learner.optimizer.state_dict(), "row_cursor": self.rows.cursor,
                 "run_id": self.tracker.run_id, "history": self.history,
                 "policy_optimizers": {p.name: p.learner.optimizer.state_dict() for p in trained}}
        ckpt.save(self.root, step, model=self.learner.model, tokenizer=self.tokenizer, state=state,
                  keep=int(self.t.keep_checkpoints), policies={p.name: (p.learner.model, p.tokenizer) for p in trained})

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
                metrics = self._train_step(step)
                if step == steps or (eval_every and step % eval_every == 0):
                    metrics.update(self._evaluate(step))
                self.tracker.log(metrics, step=step)
                if ckpt_every and (step % ckpt_every == 0 or step == steps):
                    self._save(step)
                bar.set_postfix(reward=f"{metrics['train/reward']:.3f}",
                                eval=f"{self.history['eval/reward'][-1][1]:.3f}")
                final = metrics
            greedy, _ = evaluate(self.services, self.plan.bundle, self.cfg.env.eval_split, limit=t.eval_limit,
                                 temperature=0.0, prefix="eval_greedy")
            self.tracker.log(greedy, step=steps)
            final.update(greedy)
            if "eval/reward" not in final and self.history["eval/reward"]:
                final["eval/reward"] = self.history["eval/reward"][-1][1]
        finally:
            self.services.close()
            self._plot()
        return final

    # ------------------------------------------------------------------ cleanup

    def _plot(self) -> None:
        try:
            run_dir = Path(self.plan.run_dir)
            path = reward_curves(self.history, run_dir / "reward_curves.png", title=self.cfg.task_name)
            self.tracker.log_artifact(path, "plots")
        except Exception:  # noqa: BLE001 - a missing figure must not fail a finished run
            log.exception("could not draw the reward curves")
