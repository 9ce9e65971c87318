"""What `run.py` and `plan.py` may ask of a trainer backend: the `Trainer` protocol, and `TrainerBase`, its
defaults, which every backend (grpo, sft, trl, miles) inherits.

A trainer is built by `run.py` as `trainer_cls(plan=plan, tracker=tracker)`; `fit()` runs it to the end:
`setup(plan)` (returns the first step: 1, or the one after a resumed checkpoint), `train_step(step)` per step,
`cleanup()` whatever happened. The built-in GRPO trainer takes its steps itself. TRL, SFT and Miles run their
steps inside a loop of their own (TRL's `Trainer.train`, the SFT loop, Miles' processes): their `fit()` is that
loop, and their `train_step` says so. The class-level declarations are read at plan time, before any trainer
exists: what `trainer.resume` resolves to, who checks `model.path`, a backend's own refusals, its dry run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrl.config.schema import RunConfig
    from agentrl.trainers.common.step_products import StepStats


@runtime_checkable
class Trainer(Protocol):
    """A training backend, as run.py and plan.py use it."""

    # What `trainer.resume` resolves to at plan time (`trainers/common/resume.py`: AGENTRL, TRANSFORMERS); None: the
    # backend does not resume from a checkpoint folder.
    checkpoint_kind: ClassVar[str | None]
    resumes_itself: ClassVar[bool]  # resumes on its own (Miles' --load): trainer.resume=latest needs no folder
    checks_model_itself: ClassVar[bool]  # model.path lives where the backend runs: the plan leaves it alone

    @classmethod
    def plan_problem(cls, settings: RunConfig) -> str | None:
        """Why the run's typed settings (`RunConfig`, `Plan.settings`) cannot run on this backend (None: they can);
        the plan refuses them before anything starts."""

    @classmethod
    def dry_run_report(cls, plan: Any) -> str | None:
        """What a dry run prints besides the plan (e.g. the exact command Miles would launch); None: nothing."""

    def setup(self, plan: Any) -> int:
        """Build what the steps need from `plan`; returns the first step to run."""

    def train_step(self, step: int) -> StepStats:
        """One training step (1-based)."""

    def cleanup(self) -> None:
        """Release what `setup` started; runs whatever happened."""

    def fit(self) -> dict[str, float]:
        """The whole run; returns the final metrics (their `eval/reward` is a sweep's objective)."""

    def closing_lines(self) -> list[str]:
        """Lines for the end-of-run block: what the trainer saw go wrong (e.g. steps that trained nothing)."""


class TrainerBase:
    """The `Trainer` defaults: no resume, the plan checks the model, no refusals, no dry-run report, no steps
    of its own (a loop elsewhere runs them: `fit`), no closing notes. Each backend writes its `fit()`."""

    checkpoint_kind: ClassVar[str | None] = None
    resumes_itself: ClassVar[bool] = False
    checks_model_itself: ClassVar[bool] = False
    plan: Any
    tracker: Any

    @classmethod
    def plan_problem(cls, settings: RunConfig) -> str | None:
        """None: every config the schema accepts runs on this backend."""
        return None

    @classmethod
    def dry_run_report(cls, plan: Any) -> str | None:
        """None: a dry run prints the plan only."""
        return None

    def setup(self, plan: Any) -> int:
        """Nothing to build before the first step."""
        self.plan = plan
        return 1

    def train_step(self, step: int) -> StepStats:
        """Refused: this backend's steps run inside its own loop (`fit`)."""
        raise NotImplementedError(f"{type(self).__name__} runs its steps inside its own loop: call fit()")

    def cleanup(self) -> None:
        """Nothing to release."""

    def closing_lines(self) -> list[str]:
        """No notes."""
        return []


# Every member a trainer class must have: the protocol's attributes and methods (a class, not an instance, is
# checked: the plan reads the class-level declarations before any trainer exists).
MEMBERS = ("checkpoint_kind", "resumes_itself", "checks_model_itself", "plan_problem", "dry_run_report", "setup",
           "train_step", "cleanup", "fit", "closing_lines")


def missing_members(trainer_cls: type) -> list[str]:
    """The `Trainer` members `trainer_cls` lacks (empty: it is a trainer); inheriting `TrainerBase` gives all."""
    return [name for name in MEMBERS if not hasattr(trainer_cls, name)]
