"""One `Sampling` value: its checks, its request, the plan's (from the trainer's typed settings), and an eval that
samples exactly as training does, top_k included (issue 28: the eval used to drop it)."""

from __future__ import annotations

import ast
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import agentrl
from agentrl.config.sampling import Sampling, SamplingError
from agentrl.config.trainer import TEMPERATURE, SFTTrainerConfig
from agentrl.plan import PlanError, build_plan
from agentrl.testing.config import compose_config
from agentrl.testing.tiny_models import shared_tiny_model

SMALL = dict(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
             max_position_embeddings=512)


composed = compose_config


# ------------------------------------------------------------------ the value


def test_request_kwargs_carry_top_k_only_when_it_is_on():
    assert Sampling(1.1, 0.9, 0).request_kwargs() == {
        "temperature": 1.1, "top_p": 0.9, "chat_template_kwargs": {"enable_thinking": False}}
    assert Sampling(0.7, 1.0, 5).request_kwargs()["top_k"] == 5


def test_greedy_copy_sends_temperature_0_and_at_changes_only_the_temperature():
    s = Sampling(1.1, 0.9, 5)
    greedy = s.greedy_copy()
    assert greedy.greedy and greedy.request_kwargs()["temperature"] == 0.0
    assert (greedy.top_p, greedy.top_k) == (0.9, 5)
    assert s.at(0.6) == Sampling(0.6, 0.9, 5) and greedy.at(0.6) == Sampling(0.6, 0.9, 5)
    first = s.request_kwargs()
    first["chat_template_kwargs"]["enable_thinking"] = True  # a caller's edit never reaches the next request
    assert s.request_kwargs()["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"temperature": -0.1}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"), ({"temperature": "1.1"}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": math.nan}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"), ({"top_k": True}, "top_k"),
    ({"greedy": 1}, "greedy"),
])
def test_a_setting_no_engine_could_honour_is_refused_by_name(kwargs: dict[str, Any], names: str):
    settings = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, **kwargs}
    with pytest.raises(SamplingError, match=names):
        Sampling(**settings)


# ------------------------------------------------------------------ the plan's


@pytest.mark.parametrize("trainer", ["grpo", "trl", "miles", "sft"])
def test_the_plan_builds_it_once_from_the_trainers_typed_settings(trainer: str, tmp_path: Path):
    # Miles plays through SGLang (its tool-call parser): the plan refuses it under another engine.
    extra = {"grpo": ["trainer.top_k=7"], "trl": ["trainer.top_k=7"], "miles": ["inference=sglang"]}.get(trainer, [])
    cfg = composed(f"trainer={trainer}", "trainer.top_p=0.8" if trainer != "sft" else "trainer.eval_temperature=0.9",
                   *extra, f"paths.output_root={tmp_path}")
    plan = build_plan(cfg, choices={"trainer": trainer}, run_dir=tmp_path / "run")
    want = {"grpo": Sampling(TEMPERATURE, 0.8, 7), "trl": Sampling(TEMPERATURE, 0.8, 7),
            "miles": Sampling(TEMPERATURE, 0.8, 0), "sft": Sampling(0.9, 1.0, 0)}[trainer]
    assert plan.sampling == want


def test_the_sft_eval_temperature_and_the_rl_temperature_share_one_default():
    assert SFTTrainerConfig().sampling().temperature == TEMPERATURE


def test_a_bad_sampling_setting_fails_when_the_plan_is_built(tmp_path: Path):
    cfg = composed("trainer.top_p=1.5", f"paths.output_root={tmp_path}")
    with pytest.raises(PlanError, match="top_p"):
        build_plan(cfg, choices={}, run_dir=tmp_path / "run")


def test_no_temperature_fallback_remains_below_the_plan():
    """Every temperature comes from the schema: no `.get("temperature", 1.1)`-like fallback, and no module
    under agentrl/trainers or agentrl/play builds its own request kwargs (the old copies each restated them)."""
    root = Path(agentrl.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in ("temperature", "eval_temperature", "top_p", "top_k")
                    and len(node.args) > 1 and "kwargs" not in ast.unparse(node.func.value)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
            if (path.relative_to(root).parts[0] in ("trainers", "play") and isinstance(node, ast.Dict)
                    and any(isinstance(k, ast.Constant) and k.value == "chat_template_kwargs" for k in node.keys)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: request kwargs built here")
    assert not found, "sampling settings restated below the plan (use plan.sampling):\n" + "\n".join(found)


# ------------------------------------------------------------------ an eval samples as training does


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_tiny_model(seed=0, **SMALL)  # read only: built once per session


def test_a_trainers_eval_samples_with_the_training_top_k_and_greedy_with_temperature_0(tiny: str, tmp_path: Path):
    """A real eval on the tiny model through the real session server: every generate call the engine gets
    carries the trainer's top_k and top_p (before issue 28 the eval sent neither top_k nor, greedy, anything
    but temperature 0 and top_p)."""
    from agentrl.play.evaluate import trainer_eval
    from agentrl.play.services import start_services

    small = [f"model.{k}={v}" for k, v in SMALL.items()]
    cfg = composed("env=arith", f"model.path={tiny}", *small, "agent.max_turns=1", "agent.max_response_tokens=4",
                   "trainer.top_k=3", "trainer.top_p=0.9", "trainer.temperature=0.8", "trainer.eval_limit=2",
                   "trainer.warm_start.enabled=false", f"paths.output_root={tmp_path}")
    plan = build_plan(cfg, choices={"env": "arith"}, run_dir=tmp_path / "run")
    services = start_services(plan, tiny)
    calls: list[dict[str, Any]] = []
    generate = services.engine.generate

    async def recorded(prompt_ids: list[int], **kwargs: Any) -> Any:  # the real engine generates; we only look
        calls.append(kwargs)
        return await generate(prompt_ids, **kwargs)

    services.engine.generate = recorded
    try:
        times: Counter[str] = Counter()
        history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        trainer_eval(services, plan.bundle, plan.settings, 0, sampling=plan.sampling, greedy=False, times=times,
                     history=history)
        sampled = list(calls)
        calls.clear()
        trainer_eval(services, plan.bundle, plan.settings, 0, sampling=plan.sampling, greedy=True, times=times,
                     history=history)
    finally:
        services.close()
    assert len(sampled) >= 2 and calls, "the eval played no model turn"
    assert {(c["temperature"], c["top_p"], c["top_k"]) for c in sampled} == {(0.8, 0.9, 3)}
    assert {c["temperature"] for c in calls} == {0.0}
    assert history["eval/reward"] and times["eval"] > 0
