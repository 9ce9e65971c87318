"""What `trainer.resume` resumes: a checkpoint found by `latest`, an MLflow run id or a folder, checked against
the config it was made with.

Every checkpoint holds `agentrl_run.json` (its MLflow run id, the group choices and the resolved config). A resume
whose model, env, agent, reward or trainer differs from it is refused, naming the keys, unless
`trainer.resume_force=true`; the plan resolves all of it before anything starts, so a typo fails at once.
Two layouts are known: the built-in trainer's `step-NNNNNN/state.pt` and transformers' `checkpoint-N/`
(`trainer=trl`, TRL's own checkpoints, resumed with `resume_from_checkpoint`). Either backend writes its
checkpoints under `checkpoint_root` (the run's own folder); `latest` searches every run's of the task.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from agentrl.config.schema import RunConfig, settings_dict

RECORD = "agentrl_run.json"
AGENTRL, TRANSFORMERS = "agentrl", "transformers"  # the two checkpoint layouts
_LAYOUTS = {AGENTRL: (re.compile(r"^step-(\d{6,})$"), "state.pt"),
            TRANSFORMERS: (re.compile(r"^checkpoint-(\d+)$"), "trainer_state.json")}
_OFF = {"", "false", "off", "none", "null", "no", "0"}
_LATEST = {"latest", "true", "yes", "on", "1"}
# The groups whose choice, and whose keys, define what a checkpoint is a checkpoint of.
GROUPS = ("model", "env", "agent", "reward", "trainer")
# Keys of those groups that only say how this process runs (where the server is, how long to wait): a resume
# may change them. The trainer's own keys (steps, lr, ...) are the run's schedule, not its identity.
RUNTIME_KEYS = {"env": {"server", "token_var", "connect_timeout", "step_timeout", "room_timeout"},
                "agent": {"model_timeout", "health"}}


class ResumeError(ValueError):
    """`trainer.resume` names nothing resumable, or a checkpoint of a different config."""


def resume_mode(value: Any) -> str | None:
    """None (off), `latest`, or the run id / folder given. `true`/`false` are the old spellings of latest/off."""
    if value is None:
        return None
    text = str(value).strip()
    if text.lower() in _OFF:
        return None
    return "latest" if text.lower() in _LATEST else text


def checkpoints(root: Path, kind: str) -> list[tuple[int, Path]]:
    """Complete checkpoints of layout `kind` directly under `root`, oldest step first."""
    pattern, marker = _LAYOUTS[kind]
    if not Path(root).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(root).iterdir()
             if (m := pattern.match(p.name)) and (p / marker).is_file()]
    return sorted(found)


def checkpoint_step(folder: Path, kind: str) -> int | None:
    """The step of checkpoint folder `folder`, or None when it is not a complete checkpoint of layout `kind`."""
    pattern, marker = _LAYOUTS[kind]
    m = pattern.match(Path(folder).name)
    return int(m.group(1)) if m and (Path(folder) / marker).is_file() else None


def checkpoint_record(plan: Any, run_id: str | None) -> dict[str, Any]:
    """What a checkpoint records about the run of `plan` (written into each checkpoint as `agentrl_run.json`):
    its MLflow run id, its group choices and its whole resolved config."""
    return {"run_id": run_id, "choices": {g: plan.choices.get(g) for g in GROUPS},
            "config": settings_dict(plan.settings)}


def write_record(folder: Path, record: dict[str, Any], step: int) -> None:
    """Write `record` (with its step) into checkpoint folder `folder`."""
    path = Path(folder) / RECORD
    tmp = path.with_name(f".{RECORD}.tmp")
    tmp.write_text(json.dumps({**record, "step": step}, indent=1, default=str))
    os.replace(tmp, path)  # a reader sees the whole record or none


def read_record(folder: Path) -> dict[str, Any] | None:
    """The record of checkpoint folder `folder`, None when it has none (made before agentrl wrote one)."""
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResumeError(f"trainer.resume: cannot read {path}: {exc}") from exc


def resumed_history(checkpoint: Path, step: int, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    """The reward curves' points up to `step` that a checkpoint's record holds (trainer=trl writes them)."""
    saved = (read_record(checkpoint) or {}).get("history") or {}
    return {key: [(int(s), float(v)) for s, v in saved.get(key, []) if int(s) <= step] for key in keys}


def _flatten(node: Any, prefix: str) -> dict[str, str]:
    if isinstance(node, dict) and node:
        out: dict[str, str] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}"))
        return out
    if isinstance(node, list) and node:
        return {k: v for i, value in enumerate(node) for k, v in _flatten(value, f"{prefix}.{i}").items()}
    return {prefix: json.dumps(node, default=str, sort_keys=True)}


def identity(config: dict[str, Any], choices: dict[str, Any]) -> dict[str, str]:
    """The keys that define what a run trains: group choices, and every non-runtime key of model/env/agent/reward.

    Paths under the project root are compared relative to it, so a checkpoint moved with its root still matches.
    """
    root = str((config.get("paths") or {}).get("root") or "")
    out = {f"choice of {g}": json.dumps(choices.get(g)) for g in GROUPS}
    out["trainer._target_"] = json.dumps((config.get("trainer") or {}).get("_target_"))
    for group in ("model", "env", "agent", "reward"):
        node = {k: v for k, v in (config.get(group) or {}).items() if k not in RUNTIME_KEYS.get(group, ())}
        out.update(_flatten(node, group))
    if root:
        out = {k: v.replace(json.dumps(root)[1:-1], "${paths.root}") for k, v in out.items()}
    return out


def trainer_changes(record: dict[str, Any], settings: RunConfig) -> list[str]:
    """`trainer.key: saved -> now` for every trainer key (but the resume's own) set otherwise than in a checkpoint's
    record: what a resume may change (steps to extend a run, a new lr), which the run's MLflow params cannot show."""
    saved = _flatten((record.get("config") or {}).get("trainer") or {}, "trainer")
    now = _flatten(settings_dict(settings).get("trainer") or {}, "trainer")
    own = {"trainer.resume", "trainer.resume_force", "trainer._target_"}
    return [f"{key}: {saved.get(key, '<absent>')} -> {now.get(key, '<absent>')}"
            for key in sorted((set(saved) | set(now)) - own) if saved.get(key) != now.get(key)]


def differences(record: dict[str, Any], settings: RunConfig, choices: dict[str, Any]) -> list[str]:
    """`key: saved -> now` for every identity key that differs between a checkpoint's record and `settings`."""
    saved = identity(record.get("config") or {}, record.get("choices") or {})
    now = identity(settings_dict(settings), choices)
    return [f"{key}: {saved.get(key, '<absent>')} -> {now.get(key, '<absent>')}"
            for key in sorted(set(saved) | set(now)) if saved.get(key) != now.get(key)]


@dataclass(frozen=True)
class ResumeTarget:
    """The checkpoint a run resumes (None: `latest` found none, the run starts fresh) and its MLflow run."""

    asked: str  # latest, a run id or a folder, as given
    checkpoint: Path | None
    step: int | None = None
    run_id: str | None = None
    searched: str = ""  # where `latest` looked
    forced: tuple[str, ...] = ()  # the differences trainer.resume_force=true let through
    # trainer keys set otherwise than the checkpoint's run had them (its schedule: steps, lr, ...): allowed, and
    # tagged, since the reopened run's params keep their first values
    changed: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the plan: exactly what a run of this config resumes."""
        if self.checkpoint is None:
            return f"latest: no checkpoint under {self.searched}; the run starts fresh"
        run = f"MLflow run {self.run_id} (reopened)" if self.run_id else "a new MLflow run (the checkpoint names none)"
        line = f"{self.checkpoint} (step {self.step}; continues at step {int(self.step or 0) + 1}) into {run}"
        if self.forced:
            line += f"; forced past {len(self.forced)} differences: {'; '.join(self.forced)}"
        if self.changed:
            line += f"; with trainer keys changed: {'; '.join(self.changed)}"
        return line

    def tags(self) -> dict[str, str]:
        """The tags a resumed run carries: what it resumed, and what a forced resume changed."""
        tags = {"agentrl.resume.checkpoint": str(self.checkpoint), "agentrl.resume.step": str(self.step),
                "agentrl.resume.forced": str(bool(self.forced)).lower()}
        if self.forced:
            tags["agentrl.resume.differences"] = "; ".join(self.forced)
        if self.changed:
            tags["agentrl.resume.trainer_changes"] = "; ".join(self.changed)
        return tags


def _run_id_of(folder: Path, kind: str) -> str | None:
    record = read_record(folder)
    if record is not None:
        return record.get("run_id")
    if kind == AGENTRL:  # older checkpoints: the run id is in state.pt (checkpoint.py writes it)
        import torch

        try:
            return torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=False).get("run_id")
        except (OSError, RuntimeError) as exc:
            raise ResumeError(f"trainer.resume: cannot read checkpoint {folder}: {exc}") from exc
    return None


class CheckpointPathSettings(Protocol):
    """The trainer schema of a backend with a checkpoint layout (grpo, trl): its own `checkpoint_path`."""

    checkpoint_path: str | None


def own_checkpoint_path(settings: RunConfig) -> str | None:
    """`trainer.checkpoint_path` (null: the run's folder under <paths.checkpoint_dir>/<task_name>,
    `checkpoint_root`); read only for a backend with a checkpoint layout, whose schema carries it."""
    return cast(CheckpointPathSettings, settings.trainer).checkpoint_path


def checkpoint_root(settings: RunConfig, run_id: str | None) -> Path:
    """`trainer.checkpoint_path`, else `<paths.checkpoint_dir>/<task_name>/<run id>` (`settings`: `Plan.settings`)."""
    if own := own_checkpoint_path(settings):
        return Path(own)
    return Path(settings.paths.checkpoint_dir) / settings.task_name / (run_id or "no-run")


def _task_roots(settings: RunConfig) -> list[Path]:
    if own := own_checkpoint_path(settings):
        return [Path(own)]
    return sorted(p for p in (Path(settings.paths.checkpoint_dir) / settings.task_name).glob("*") if p.is_dir())


def _newest(roots: list[Path], kind: str) -> Path | None:
    found = [(path.stat().st_mtime, path) for root in roots if (c := checkpoints(root, kind)) for path in [c[-1][1]]]
    return max(found)[1] if found else None


def _looks_like_folder(value: str) -> bool:
    return os.sep in value or value.startswith((".", "~")) or Path(value).expanduser().exists()


def _find(settings: RunConfig, asked: str, kind: str) -> tuple[Path | None, str]:
    """The checkpoint `asked` names (None: latest found none) and where `latest` looked."""
    own, checkpoint_dir = own_checkpoint_path(settings), settings.paths.checkpoint_dir
    if asked == "latest":
        roots = _task_roots(settings)
        where = str(own or Path(checkpoint_dir) / settings.task_name / "*")
        return _newest(roots, kind), where
    if _looks_like_folder(asked):
        folder = Path(asked).expanduser().resolve()
        if not folder.is_dir():
            raise ResumeError(f"trainer.resume={asked}: no such folder")
        if checkpoint_step(folder, kind) is not None:
            return folder, ""
        if found := checkpoints(folder, kind):
            return found[-1][1], ""
        pattern = "step-NNNNNN/state.pt" if kind == AGENTRL else "checkpoint-N/trainer_state.json"
        raise ResumeError(f"trainer.resume={asked}: {folder} is not a checkpoint of this trainer and holds none "
                          f"({pattern})")
    # An MLflow run id: its checkpoints live under <checkpoint_dir>/<task>/<run id> (any task) or checkpoint_path.
    if own:
        mine = [p for _, p in checkpoints(Path(own), kind) if _run_id_of(p, kind) == asked]
        if mine:
            return mine[-1], ""
    elif newest := _newest(sorted(Path(checkpoint_dir).glob(f"*/{asked}")), kind):
        return newest, ""
    known = sorted({_run_id_of(c[-1][1], kind) or root.name for root in _task_roots(settings)
                    if (c := checkpoints(root, kind))})
    where = own or f"{checkpoint_dir}/*/{asked}"
    raise ResumeError(f"trainer.resume={asked}: no checkpoint of an MLflow run {asked} (looked in {where}); "
                      f"the runs of task {settings.task_name} with checkpoints: {', '.join(known) or 'none'}. "
                      "Give a run id from those, latest, or a checkpoint folder")


def run_checkpoint(settings: RunConfig, run_id: str, kind: str) -> Path | None:
    """The newest checkpoint MLflow run `run_id` has written (None: none yet): what `trainer.resume=<run id>`
    would continue from."""
    try:
        return _find(settings, run_id, kind)[0]
    except ResumeError:
        return None


def resolve_resume(settings: RunConfig, choices: dict[str, Any], kind: str) -> ResumeTarget | None:
    """The checkpoint `trainer.resume` names, checked against the run's typed `settings` (None: no resume
    asked)."""
    asked = resume_mode(settings.trainer.resume)
    if asked is None:
        return None
    folder, searched = _find(settings, asked, kind)
    if folder is None:
        return ResumeTarget(asked, None, searched=searched)
    record = read_record(folder)
    if record is None:
        diffs = [f"{folder} records no config (it predates {RECORD}): nothing to compare"]
    else:
        diffs = differences(record, settings, choices)
    if diffs and not settings.trainer.resume_force:
        raise ResumeError(f"trainer.resume={asked}: checkpoint {folder} was made with a different config: "
                          f"{'; '.join(diffs)}. Resume with the same settings, or set trainer.resume_force=true "
                          "(the run's params keep their old values; the differences are tagged on the run)")
    changed = trainer_changes(record, settings) if record is not None else []
    return ResumeTarget(asked, folder, step=checkpoint_step(folder, kind), run_id=_run_id_of(folder, kind),
                        forced=tuple(diffs), changed=tuple(changed))
