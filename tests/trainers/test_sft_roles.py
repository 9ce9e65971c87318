"""The role-aware warm start: its cache folder is the pattern's own, and a thinker-verifier run made from it
through the CLI starts with a non-zero eval reward (the single-agent warm start never teaches the roles'
`<final_answer>` and ACCEPT, so that pattern starts at 0 from it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.utils import instantiate

from agentrl.config.env import EnvConfig
from agentrl.config.model import ModelConfig
from agentrl.config.paths import PathsConfig
from agentrl.config.schema import RunConfig
from agentrl.config.trainer import WarmStartConfig
from agentrl.envs.bundles import load_bundle
from agentrl.testing.cli import run_agentrl
from agentrl.trainers.sft.trainer import sft_checkpoint_path

SETTINGS = WarmStartConfig(teacher="optimal", steps=400, lr=3e-3, batch_samples=32, warmup_steps=50, augment=0,
                           weight_decay=0.0)


def _folder(tmp_path: Path, agent: dict | None) -> Path:
    run = RunConfig(env=EnvConfig(bundle="arith"), model=ModelConfig(path="/m/tiny"),
                    paths=PathsConfig(checkpoint_dir=str(tmp_path)), seed=0)
    return sft_checkpoint_path(run, SETTINGS, load_bundle("arith"), instantiate(agent) if agent else None)


def test_each_pattern_gets_its_own_warm_start_folder(tmp_path: Path) -> None:
    tv = {"_target_": "agentrl.agents.thinker_verifier.ThinkerVerifierAgent"}
    adv = {"_target_": "agentrl.agents.adversarial.AdversarialAgent"}
    co = {"_target_": "agentrl.agents.co_evolution.CoEvolutionAgent", "num_parallel": 3}
    single = {"_target_": "agentrl.agents.tool_calling.ToolCallingAgent"}
    folders = {name: _folder(tmp_path, agent) for name, agent in
               (("tv", tv), ("adv", adv), ("co", co), ("single", single), ("none", None))}
    assert len({folders[n] for n in ("tv", "adv", "co", "single")}) == 4
    assert folders["tv"].name.startswith("arith-thinker_verifier-optimal-s400-")
    assert folders["adv"].name.startswith("arith-adversarial-optimal-s400-")
    # The single agent's folder keeps the name it had before patterns had warm starts of their own.
    assert folders["single"] == folders["none"] and folders["single"].name.startswith("arith-optimal-s400-")
    # What changes the demonstrations changes the folder (a role's prompt, num_parallel); what does not, not.
    assert _folder(tmp_path, {**co, "num_parallel": 2}) != folders["co"]
    assert _folder(tmp_path, {**tv, "roles": [{"name": "verifier", "prompt": "Say ACCEPT."}]}) != folders["tv"]
    assert _folder(tmp_path, {**tv, "max_response_tokens": 64, "max_turns": 2}) == folders["tv"]


def _toy_bundle(root: Path) -> Path:
    """A folder bundle (the `agentrl.envs new` template) whose every task's answer is "ok": what is learned is
    the pattern's format, nothing else."""
    from agentrl.envs.__main__ import main

    assert main(["new", "toy", "--dir", str(root)]) == 0
    folder = root / "toy"
    words = ["ab", "cd", "ef", "gh"]
    for split, n in (("train", 32), ("eval", 4)):
        rows = [{"task_id": f"toy-{split}-{i}", "word": words[i % 4], "answer": "ok"} for i in range(n)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["refresh", str(folder)]) == 0
    return folder


@pytest.mark.slow
def test_thinker_verifier_starts_with_a_nonzero_eval_reward_from_its_warm_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["env=custom", f"env.bundle={_toy_bundle(tmp_path)}", "agent=thinker_verifier", "reward=env_score",
            "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
            "model.intermediate_size=64", "model.vocab_size=1024", "trainer.warm_start.enabled=true",
            "trainer.warm_start.teacher=label", "trainer.warm_start.steps=120", "trainer.warm_start.lr=3e-3",
            "trainer.warm_start.batch_samples=8", "trainer.warm_start.warmup_steps=10",
            "trainer.warm_start.augment=0", "trainer.steps=2", "trainer.eval_every=1", "trainer.eval_limit=4",
            "trainer.prompts_per_step=1", "trainer.samples_per_prompt=2", "trainer.temperature=0.7",
            "trainer.lr=1e-5", "trainer.threads=1", "trainer.checkpoint_every=0", "agent.max_turns=2",
            "agent.max_response_tokens=24"]
    cli = run_agentrl(args, home, seed_model=False, seed_store=False, timeout=900)  # it builds model and store
    assert "SFT on label role demonstrations" in cli.stdout
    assert "/sft/toy-thinker_verifier-label-s120-" in cli.stdout
    client = cli.client()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    run = next(r for r in runs if "eval/reward" in r.data.metrics)
    start = [m.value for m in client.get_metric_history(run.info.run_id, "eval/reward") if m.step == 0]
    assert start and start[0] > 0, f"the eval before any GRPO step scored {start}"
    # The warm start's own eval plays the same weights on 4 tasks sampled with other seeds: it can draw 0 by chance
    # (CI did, once the sampler's draws changed); step 0's above carries the claim, this one must be logged.
    assert 0.0 <= run.data.metrics["warm_start/eval/reward"] <= 1.0
