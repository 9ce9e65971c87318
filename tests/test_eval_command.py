"""`python -m agentrl eval` on the tiny model, read back from the run folder and MLflow's real store: per-task
results whose pass@k agrees with their samples, an eval table, a run tagged as an evaluation holding no
training metrics; a training run's own evals write the same per-task files; `agentrl compare` pairs two runs by id.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from agentrl.paired import pass_at_k
from agentrl.play.eval_results import majority_score, pass_metrics
from agentrl.testing.cli import run_agentrl

SHAPE = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
         "model.intermediate_size=64", "model.vocab_size=1024", "agent.max_response_tokens=24"]
TRAIN = ["trainer.steps=1", "trainer.warm_start.enabled=false", "trainer.prompts_per_step=2",
         "trainer.samples_per_prompt=2", "trainer.eval_limit=3", "trainer.eval_every=1", "trainer.checkpoint_every=0", "trainer.max_extra_rows=0", *SHAPE]


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    return run_agentrl(args, home, check=False).process


def _run_id(stdout: str) -> str:
    line = next(x for x in stdout.splitlines() if x.startswith("MLflow "))
    return line.split(" run ")[-1].strip()


def test_pass_metrics_by_hand() -> None:
    records = [{"samples": [{"score": 1.0}, {"score": 0.0}, {"score": 0.5}]},  # passes at 0.5: 2 of 3
               {"samples": [{"score": 0.0}, {"score": 0.2}, {"score": 0.0}]}]  # 0 of 3
    m = pass_metrics(records, 0.5, "eval")
    assert m == pytest.approx({"eval/pass_at_1": (2 / 3 + 0) / 2, "eval/pass_at_2": (1 + 0) / 2,
                               "eval/pass_at_3": (1 + 0) / 2})


@pytest.mark.slow
def test_eval_command_then_compare(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    home = tmp_path / "home"
    train = _cli(TRAIN, home)
    assert train.returncode == 0, train.stderr[-4000:]
    train_id = _run_id(train.stdout)
    train_dir = next((home / "outputs" / "runs" / "train").iterdir())
    # Training's own evals write the per-task file too, one per eval (sampled and greedy-decoded).
    written = sorted(p.name for p in (train_dir / "evals").glob("*.jsonl"))
    assert "eval-step-1.jsonl" in written and "eval_greedy-step-1.jsonl" in written, written
    assert "per-task eval" in train.stdout or "evals/" in train.stdout
    # The closing block: the env's grade on a named subset; the engine's start timed; no warm start (it was off).
    block = train.stdout[train.stdout.index("== agentrl run FINISHED"):]
    assert re.search(r"final eval/grade +[\d.]+ sampled, [\d.]+ greedy-decoded \(3 of 200 tasks, stratified by "
                     r"duration_h\)", block), block
    wall = next(line for line in block.splitlines() if line.startswith("wall time"))
    assert "engine start" in wall and "warm start" not in wall, wall

    ev = _cli(["eval", f"eval.model={train_id}", "eval.samples=3", "eval.limit=3", "eval.pass_score=0.0",
               *SHAPE], home)
    assert ev.returncode == 0, ev.stderr[-4000:]
    eval_id = _run_id(ev.stdout)
    eval_dir = next((home / "outputs" / "runs" / "eval").iterdir())
    records = [json.loads(x) for x in (eval_dir / "evals" / "eval.jsonl").read_text().splitlines()]
    # eval.limit=3 of GridSim's 200 eval days: one of each battery duration, not the first three (all 1-hour)
    assert sorted(r["facts"]["duration_h"] for r in records) == [1, 2, 4], records
    assert all(len(r["samples"]) == 3 for r in records)
    assert all({"score", "grade", "reward", "completion_tokens", "tool_calls", "answer"} <= s.keys()
               for r in records for s in r["samples"])

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    run = client.get_run(eval_id)
    assert run.data.tags["agentrl.run_kind"] == "evaluation"
    # its own description and the evaluated model's run, not the training config's
    assert run.data.tags["mlflow.note.content"].startswith(f"agentrl eval of {train_id} on gridsim split eval: "
                                                           "3 of 200 tasks, stratified by duration_h")
    assert run.data.tags["agentrl.eval.model_run"] == train_id
    assert run.data.tags["agentrl.eval.subset"] == "3 of 200 tasks, stratified by duration_h"
    # every eval play is traced, as in training's evals: 3 tasks x 3 samples
    traces = list(client.search_traces(locations=[run.info.experiment_id], run_id=eval_id, max_results=50))
    assert len(traces) == 9 and {t.info.tags.get("split") for t in traces} == {"eval"}

    def eval_inputs(run_id: str) -> list:
        return [i.dataset for i in client.get_run(run_id).inputs.dataset_inputs
                if any(t.key == "mlflow.data.context" and t.value == "eval" for t in i.tags)]

    # One split, one dataset: the eval run logs the training run's eval entry, the bundle's data options included.
    (evaluated,), (trained,) = eval_inputs(eval_id), eval_inputs(train_id)
    assert evaluated.digest == trained.digest and evaluated.profile == trained.profile
    assert "agentrl.run_kind" not in client.get_run(train_id).data.tags
    assert run.data.tags["agentrl.eval.model"] == str(train_dir / "final_model")
    metrics = run.data.metrics
    # no train/, rollout/, time/: eval/* and the run page's summary copies of eval/grade and eval/reward
    assert metrics and all(k.startswith("eval/") for k in metrics if not k.startswith("_summary/")), sorted(metrics)
    assert {k for k in metrics if k.startswith("_summary/")} == {"_summary/eval_grade", "_summary/eval_reward"}
    for k in (1, 2, 3):  # pass@k from the samples in the file (a pass: score >= 0.0, the asked pass_score)
        expect = sum(pass_at_k(3, sum(s["score"] >= 0.0 for s in r["samples"]), k) for r in records) / 3
        assert metrics[f"eval/pass_at_{k}"] == pytest.approx(expect)
    samples = [s for r in records for s in r["samples"]]
    assert metrics["eval/reward"] == pytest.approx(sum(s["score"] for s in samples) / 9)
    assert metrics["eval/grade"] == pytest.approx(sum(s["grade"] for s in samples) / 9)
    # what the plays did: the share with a valid tool call, the calls a play, each failure kind's share
    assert metrics["eval/tool_call_rate"] == pytest.approx(sum(s["tool_calls"] > 0 for s in samples) / 9)
    assert metrics["eval/tool_calls_per_play"] == pytest.approx(sum(s["tool_calls"] for s in samples) / 9)
    kinds = {s["failure"] for s in samples} - {None}
    assert metrics["eval/failure_share"] == pytest.approx(sum(s["failure"] is not None for s in samples) / 9)
    for kind in kinds:
        assert metrics[f"eval/failure/{kind}"] == pytest.approx(sum(s["failure"] == kind for s in samples) / 9)
    # maj@3: the file's samples voted (majority_score is checked by hand in tests/test_majority_vote.py)
    assert metrics["eval/maj_at_3"] == pytest.approx(sum(majority_score(r) for r in records) / 3)
    artifacts = {a.path for a in client.list_artifacts(eval_id, "evals")}
    assert {"evals/eval.jsonl", "evals/eval_table.json"} <= artifacts, artifacts
    table = json.loads(Path(client.download_artifacts(eval_id, "evals/eval_table.json", str(tmp_path))).read_text())
    assert len(table["data"]) == 9 and {"task_id", "prompt", "completion", "tool_calls", "score", "reward"} <= set(
        table["columns"])
    log = (eval_dir / "__main__.log").read_text()
    assert "eval/grade" in log and "== agentrl eval FINISHED" in log and "pass@3" in log and "maj@3" in log
    assert "(3 of 200 tasks, stratified by duration_h x 3 samples)" in ev.stdout
    assert f"tool calls    {metrics['eval/tool_call_rate']:.0%} of plays made a valid tool call" in ev.stdout
    assert "failures      " in ev.stdout

    both = _cli(["compare", eval_id, train_id], home)
    assert both.returncode == 0, both.stderr[-3000:]
    assert "A - B, paired by task:" in both.stdout and "n 3:" in both.stdout
    assert "(eval-step-1.jsonl)" in both.stdout and "duration_h=" in both.stdout


@pytest.mark.slow
def test_eval_plays_a_role_on_its_own_model_and_refuses_a_missing_one(tmp_path: Path) -> None:
    from agentrl.models.tiny import ensure_tiny_model

    # Training plays a role that names its own model on that model; an eval of the same config must too.
    verifier = ensure_tiny_model(str(tmp_path / "verifier"), seed=1, vocab_size=1024, hidden_size=32, num_layers=1,
                                 num_heads=2, num_kv_heads=1, intermediate_size=64)
    args = ["eval", "env=arith", "agent=thinker_verifier", "reward=env_score", "agent.max_turns=2", "eval.limit=2",
            *SHAPE]
    ok = _cli([*args, f"agent.roles.1.model={verifier}"], tmp_path / "home")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert f"role model   verifier: {verifier}" in ok.stdout
    bad = _cli([*args, f"agent.roles.1.model={tmp_path / 'missing'}"], tmp_path / "home")
    assert bad.returncode != 0 and "agentrl eval: role 'verifier': model" in bad.stderr, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr


def test_an_eval_run_is_tagged_with_the_evaluated_models_making(tmp_path: Path) -> None:
    from agentrl.eval_run import model_tags

    assert model_tags(None, "/any/folder", "unused") == {}  # the model group's own model: its tags are right
    run = tmp_path / "run"  # a training run's folder: Hydra's record names its groups
    (run / ".hydra").mkdir(parents=True)
    (run / "final_model").mkdir()
    (run / ".hydra" / "hydra.yaml").write_text(
        "hydra:\n  runtime:\n    choices:\n      model: smollm2_135m\n      env: gridsim\n      hydra/env: default\n")
    final = str(run / "final_model")
    assert model_tags(final, final, "unused") == {"choice.model": "smollm2_135m"}
    step = tmp_path / "step-000004"  # a checkpoint: its record names them, for the folder and its model/
    (step / "model").mkdir(parents=True)
    (step / "agentrl_run.json").write_text(json.dumps({"run_id": "x", "choices": {"model": "hf", "env": "arith"}}))
    assert model_tags(str(step), str(step / "model"), "unused") == {"choice.model": "hf"}
    (tmp_path / "bare").mkdir()  # a folder of unknown making is a Hugging Face folder
    assert model_tags(str(tmp_path / "bare"), str(tmp_path / "bare"), "unused") == {"choice.model": "hf"}
