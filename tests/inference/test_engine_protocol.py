"""The `Engine` protocol's capabilities: every engine class declares each one, a factory target's classes agree with
the class it declares (`@builds`), and the plan-time check (`partial_rollouts_problem`, from the config's
`_target_`) says what the engine class says."""

from __future__ import annotations

import typing

import pytest

from agentrl.inference.engines.embedded.engine import EmbeddedEngine
from agentrl.inference.engines.embedded.process import ProcessEngine, embedded_engine
from agentrl.inference.engines.protocol import (
    CAPABILITIES,
    Engine,
    builds,
    engine_class,
    missing_capabilities,
    option_engines,
)
from agentrl.inference.engines.sglang import SGLangEngine
from agentrl.inference.engines.vllm.engine import VLLMEngine
from agentrl.plan import typed_settings
from agentrl.testing.config import compose_config
from agentrl.trainers.grpo.policy_steps import partial_rollouts_problem

ENGINES = (EmbeddedEngine, ProcessEngine, VLLMEngine, SGLangEngine)
METHODS = ("generate", "update_weights", "update_adapter", "close")


def test_the_protocol_lists_each_capability_it_declares() -> None:
    hints = typing.get_type_hints(Engine, include_extras=True)
    declared = {name for name, hint in hints.items() if typing.get_origin(hint) is typing.ClassVar}
    assert declared == set(CAPABILITIES)
    assert all(callable(getattr(Engine, m)) for m in METHODS)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_every_engine_declares_every_capability_and_the_shared_calls(engine: type) -> None:
    assert missing_capabilities(engine) == [], f"{engine.__name__} lacks a capability of engines.protocol.Engine"
    assert all(callable(getattr(engine, m, None)) for m in METHODS), engine.__name__


def test_a_factory_target_returns_classes_that_agree_with_what_it_declares() -> None:
    declared = engine_class("agentrl.inference.engines.embedded.process.embedded_engine")
    assert declared is embedded_engine.engine_class  # type: ignore[attr-defined]
    for engine in (EmbeddedEngine, ProcessEngine):  # what embedded_engine returns (inference.process false | true)
        assert {c: getattr(engine, c) for c in CAPABILITIES} == {c: getattr(declared, c) for c in CAPABILITIES}


def test_every_inference_option_resolves_to_its_engine() -> None:
    assert option_engines() == {"embedded": ProcessEngine, "sglang": SGLangEngine, "vllm": VLLMEngine}


class _Half:
    """An engine class that forgot a capability."""

    KEEPS_RUNNING_ON_PUSH = True


@builds(_Half)
def _half_engine() -> _Half:
    return _Half()


def test_an_engine_of_unknown_capabilities_is_refused() -> None:
    assert missing_capabilities(_Half) == ["KEEPS_RUNNING_ON_ADAPTER_PUSH"]
    for target in (f"{__name__}._Half", f"{__name__}._half_engine"):
        with pytest.raises(TypeError, match="_Half does not declare KEEPS_RUNNING_ON_ADAPTER_PUSH"):
            engine_class(target)
    with pytest.raises(TypeError, match="neither an engine class nor a factory"):
        engine_class("agentrl.inference.engines.embedded.process.engine_threads")  # a function not marked with @builds


@pytest.mark.parametrize("option", ["embedded", "vllm", "sglang"])
@pytest.mark.parametrize("push", ["merged", "adapter"])
def test_the_plan_time_check_agrees_with_the_engine_class(option: str, push: str) -> None:
    settings = typed_settings(compose_config("+recipe=gridsim_grpo", f"inference={option}",
                                             "trainer.partial_rollouts=true", "model.lora.enabled=true",
                                             f"model.lora.push={push}"))
    engine = option_engines()[option]
    can = engine.KEEPS_RUNNING_ON_PUSH and (push == "merged" or engine.KEEPS_RUNNING_ON_ADAPTER_PUSH)
    problem = partial_rollouts_problem(settings)
    assert (problem is None) == can, problem
