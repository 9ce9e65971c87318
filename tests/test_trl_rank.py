"""A `trainer=trl` rank (the process `accelerate launch` starts) rebuilds the run's real plan from the spec: the
same typed config, and the same refusals as `run.py`'s plan, before it starts anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentrl.config.portable import PortableConfigError, from_portable, to_portable
from agentrl.plan import typed_settings
from agentrl.testing.config import compose_config
from agentrl.trainers.trl.args import WORKER_MODULE

REPO = Path(__file__).resolve().parents[1]
CHOICES = {"recipe": "gridsim_grpo", "trainer": "trl"}


def _cfg(tmp_path: Path):
    return compose_config("+recipe=gridsim_grpo", "trainer=trl", f"paths.output_root={tmp_path / 'out'}")


def _spec(tmp_path: Path, config: dict) -> Path:
    """A spec as TRLTrainer._launch writes it (the folders exist; nothing in them yet)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {"config": config, "choices": CHOICES, "start_path": str(tmp_path / "no-model"),
            "output_dir": str(tmp_path / "ckpt"), "run_dir": str(run_dir),
            "metrics_path": str(run_dir / "trl_metrics.jsonl"), "final_path": str(run_dir / "trl_final.json")}
    path = run_dir / "trl_spec.json"
    path.write_text(json.dumps(spec))
    return path


def _launch_rank(spec: Path) -> subprocess.CompletedProcess:
    """The worker module exactly as `accelerate launch` runs it (one rank, no accelerate around it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", WORKER_MODULE, str(spec)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_portable_config_is_the_same_typed_config(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    again = from_portable(json.loads(json.dumps(to_portable(typed_settings(cfg)))))
    assert OmegaConf.to_container(again, resolve=True) == OmegaConf.to_container(cfg, resolve=True)
    typed = OmegaConf.to_object(again)
    assert type(typed.trainer).__name__ == "TRLTrainerConfig" and type(typed.env).__name__ == "GridSimEnvConfig"


def test_a_key_no_schema_declares_is_refused_naming_it(tmp_path: Path) -> None:
    data = to_portable(typed_settings(_cfg(tmp_path)))
    data["trainer"]["lrr"] = 1e-4
    with pytest.raises(PortableConfigError, match=r"trainer: .*'lrr'.*TRLTrainerConfig"):
        from_portable(data)


@pytest.mark.slow
@pytest.mark.parametrize("key,value,named", [
    # A schema's own check (DependencyWatchConfig.__post_init__), which only the typed plan runs.
    ("on_dependency_loss", "later", "trainer.on_dependency_loss must be stop or wait, got 'later'"),
    # A misspelled key: the old rank's untyped config carried it along silently.
    ("lrr", 1e-4, "Key 'lrr' not in 'TRLTrainerConfig'"),
    # A backend refusal (TRLTrainer.plan_problem), as run.py's plan refuses it.
    ("max_extra_rows", 16, "trainer.max_extra_rows=16 has no counterpart in TRL"),
])
def test_a_rank_refuses_what_the_plan_refuses_before_starting_anything(tmp_path: Path, key: str, value: object,
                                                                       named: str) -> None:
    data = to_portable(typed_settings(_cfg(tmp_path)))
    data["trainer"][key] = value
    done = _launch_rank(_spec(tmp_path, data))
    assert done.returncode != 0
    assert "agentrl: trainer=trl worker:" in done.stderr and named in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # one line naming the key, not a rank's traceback
    assert not (tmp_path / "run" / "trl_final.json").exists()
    assert not (tmp_path / "ckpt").exists()  # refused before TRL or any service started
