"""Your own folders: outputs and `recipes/` follow the working folder (a second clone, a project of your own),
`$AGENTRL_HOME` wins when set, and a recipe folder of your own works with Hydra's `--config-dir`."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config.locate import project_root, project_root_reason, recipe_dirs, recipes_dir
from agentrl.testing.cli import run_cli

RECIPE = """# @package _global_
defaults:
  - override /trainer: grpo
task_name: {name}
trainer:
  steps: 7
"""


def test_the_root_is_home_then_the_working_folders_project_then_the_checkout(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    clone = tmp_path / "clone"
    (clone / "recipes").mkdir(parents=True)
    (clone / "sub").mkdir()
    monkeypatch.delenv("AGENTRL_HOME", raising=False)
    monkeypatch.chdir(clone / "sub")  # from a subfolder too: the nearest folder up holding recipes/
    assert project_root() == clone.resolve() and "recipes/" in project_root_reason()
    assert recipe_dirs() == [recipes_dir(), clone.resolve() / "recipes"]  # its recipes join the shipped ones
    monkeypatch.setenv("AGENTRL_HOME", str(tmp_path / "home"))
    assert project_root() == (tmp_path / "home").resolve() and project_root_reason() == "$AGENTRL_HOME"
    assert recipe_dirs() == [recipes_dir()]
    monkeypatch.delenv("AGENTRL_HOME")
    monkeypatch.chdir(tmp_path)  # no recipes/ here or above: the checkout (or ~/agentrl for a wheel), as before
    assert project_root() != tmp_path.resolve() and "recipes/" not in project_root_reason()


@pytest.mark.slow
def test_a_second_clones_recipes_and_outputs_are_its_own(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "recipes").mkdir(parents=True)
    (clone / "recipes" / "my_grpo.yaml").write_text(RECIPE.format(name="my_grpo"))
    done = run_cli(["+recipe=my_grpo", "dry_run=true"], cwd=clone,
                   env={"AGENTRL_HOME": None, "MLFLOW_TRACKING_URI": None})  # neither set: the clone's own
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recipe     my_grpo" in done.stdout
    assert f"root       {clone.resolve()} (the working folder's project" in done.stdout
    assert (clone / "outputs" / "runs" / "my_grpo").is_dir() and (clone / "outputs" / "mlflow.db").is_file()


@pytest.mark.slow
def test_a_recipe_folder_of_your_own_with_config_dir(tmp_path: Path, agentrl_home: Path) -> None:
    mine = tmp_path / "my_conf"
    (mine / "recipe").mkdir(parents=True)  # Hydra's group folder: recipe/, as +recipe= names it
    (mine / "recipe" / "their_exp.yaml").write_text(RECIPE.format(name="their_exp"))
    done = run_cli(["--config-dir", str(mine), "+recipe=their_exp", "dry_run=true"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recipe     their_exp" in done.stdout
    assert (agentrl_home / "outputs" / "runs" / "their_exp").is_dir()
    # The same folder may add an option to another group, extending its schema as conf/ does.
    (mine / "env").mkdir()
    (mine / "env" / "my_env.yaml").write_text("defaults:\n  - /schema/env/gridsim@_here_\n  - _self_\n"
                                              "prompt_style: compact\n")
    shown = run_cli(["--config-dir", str(mine), "+recipe=their_exp", "env=my_env", "--cfg", "job"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "task_name: their_exp" in shown.stdout and "steps: 7" in shown.stdout
    assert "prompt_style: compact" in shown.stdout
