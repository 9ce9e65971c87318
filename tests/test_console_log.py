"""A quiet console whose lines the run folder's log holds: evaluation lines, one progress line per step, the
closing block; TRL's experimental-API notice once however many processes, no raw metric dicts, no empty
health line. Real runs through the CLI (a small tiny model, two steps)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentrl.testing.cli import run_agentrl

SMALL = ["+recipe=gridsim_grpo", "trainer.steps=2", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
         "trainer.eval_limit=2", "trainer.eval_every=1", "trainer.checkpoint_every=0", "trainer.warm_start.steps=2",
         "trainer.warm_start.batch_samples=2", "trainer.warm_start.generated=0", "agent.max_response_tokens=24",
         "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
         "model.intermediate_size=64", "model.vocab_size=1024", "trainer.threads=1"]
NOTICE = "You are using 'rollout_func', which is an experimental feature"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console") / "home"


def cli(args: list[str], home: Path):
    # The console a user gets: TRL's notice and the warnings filters not silenced from outside.
    run = run_agentrl(args, home, env={"TRL_EXPERIMENTAL_SILENCE": None, "PYTHONWARNINGS": None}, seed_model=False,
                      timeout=1200)
    return run.process, (run.run_dir() / "__main__.log").read_text()


@pytest.mark.slow
def test_the_run_folder_log_holds_what_the_console_showed(home: Path):
    done, log = cli([*SMALL, "trainer.model_failures=penalize"], home)
    for line in ("step 0 eval/reward", "step 1 eval/reward", "step 2 eval/reward", "step 2 eval_greedy/reward",
                 "warm_start/eval/reward", "SFT step 2/2: loss", "== agentrl run FINISHED", "final eval/grade",
                 "recipe     gridsim_grpo"):
        assert line in log, f"{line!r} not in the run's log:\n{log}"
    steps = re.findall(r"grpo step (\d)/2: train/reward [\d.]+, .*tokens \d+", log)
    assert steps == ["1", "2"], log
    console = done.stdout + done.stderr
    evals = re.findall(r"^step \d+ eval\S*/reward .*$", console, re.M)
    assert len(evals) == 4 and all(line in log for line in evals)  # one line per evaluation, in both
    assert "health:" not in console  # no ranges declared: nothing to say
    assert "Loading weights" not in console and "Writing model shards" not in console


@pytest.mark.slow
def test_trl_workers_show_the_experimental_notice_once_and_no_raw_dicts(home: Path):
    done, log = cli([*SMALL, "trainer=trl", "trainer.num_processes=2", "trainer.micro_batch_samples=2"], home)
    console = done.stdout + done.stderr
    assert console.count(NOTICE) == 1, console[-4000:]  # before: once per process
    assert log.count(NOTICE) == 1  # the workers' lines reach the parent's log
    assert "{'loss':" not in console and "'train_runtime'" not in console  # TRL's printer callback is off
    assert "find_unused_parameters=True" not in console
    assert "trl step 1: train/reward" in log and "trl step 2: train/reward" in log
    assert "step 2 eval_greedy/reward" in log
