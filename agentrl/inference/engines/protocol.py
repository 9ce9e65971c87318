"""`Engine`: what every inference engine offers the trainers and the session server (`inference=embedded`:
`EmbeddedEngine` or, in a child process, `ProcessEngine`; `inference=vllm`: `VLLMEngine`; `inference=sglang`:
`SGLangEngine`), and the capabilities each declares as class constants.

A capability is read from the engine's class: where an engine exists, from `type(engine)`; at plan time, before
any engine is built, from `engine_class(settings.inference._target_)`, the class that `_target_` builds (a factory
target names its class with `@builds`). tests/inference/test_engine_protocol.py checks every engine declares every
capability, and that a factory's classes agree with what it declares.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, cast

from agentrl.inference.engines.completion import Completion

# The capabilities an engine class declares (each a bool class constant; `Engine` documents them).
CAPABILITIES = ("KEEPS_RUNNING_ON_PUSH", "KEEPS_RUNNING_ON_ADAPTER_PUSH")


class Engine(Protocol):
    """An inference engine: samples after token prompts and takes new weights between (or during) them."""

    # update_weights(..., mode="keep") (trainer.partial_rollouts) applies the push to the replies being sampled,
    # which go on with the new weights; without it a push waits for them to finish.
    KEEPS_RUNNING_ON_PUSH: ClassVar[bool]
    # update_adapter(..., mode="keep") does the same for a LoRA adapter (vLLM: a running reply keeps the adapter
    # it was admitted with).
    KEEPS_RUNNING_ON_ADAPTER_PUSH: ClassVar[bool]

    model_path: Path  # the base model folder served (tokenizer and config)
    tokenizer: Any
    weight_version: int  # how many pushes the served weights have had
    default_stop_ids: frozenset[int]

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int = 0, stop_ids: list[int] | None = None,
                       seed: int | None = None, ignore_eos: bool = False) -> Completion:
        """Sample after `prompt_ids`."""
        ...

    def update_weights(self, source: Mapping[str, Any] | str | Path, *, timeout: float | None = None) -> int:
        """Serve a state dict (or a model folder); returns the new weight version. An engine that declares
        `KEEPS_RUNNING_ON_PUSH` also takes `mode="keep"`."""
        ...

    def update_adapter(self, adapter: Mapping[str, Any], lora: Any, *, timeout: float | None = None) -> int:
        """Serve the base with LoRA `adapter` (PEFT's state dict, `lora` its settings); returns the new version."""
        ...

    def close(self, timeout: float = 30.0) -> None:
        """Stop serving; pending calls fail."""
        ...


F = TypeVar("F", bound=Callable[..., Any])


def builds(engine: type) -> Callable[[F], F]:
    """Mark a factory `_target_` with the engine class whose capabilities what it returns has (every class it may
    return declares the same: the protocol test checks)."""
    def mark(factory: F) -> F:
        factory.engine_class = engine  # type: ignore[attr-defined]
        return factory
    return mark


def engine_class(target: str) -> type[Engine]:
    """The engine class an inference config's `_target_` builds: the class itself, or a factory's `@builds`. A
    target that cannot be imported raises ImportError or AttributeError; one whose capabilities are unknown (a
    factory without `@builds`, a class missing one of `CAPABILITIES`), TypeError."""
    module, _, name = target.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    engine = obj if isinstance(obj, type) else getattr(obj, "engine_class", None)
    if engine is None:
        raise TypeError(f"inference._target_={target} is neither an engine class nor a factory marked with "
                        f"agentrl.inference.engines.protocol.builds: its capabilities are unknown")
    if missing := missing_capabilities(engine):
        raise TypeError(f"inference._target_={target}: {engine.__name__} does not declare {', '.join(missing)} "
                        f"(agentrl.inference.engines.protocol.Engine)")
    return cast(type[Engine], engine)


def missing_capabilities(engine: type) -> list[str]:
    """The `CAPABILITIES` that `engine` does not declare as a bool class constant."""
    return [name for name in CAPABILITIES if not isinstance(getattr(engine, name, None), bool)]


def option_engines() -> dict[str, type[Engine]]:
    """Each `inference` option's engine class (by its schema's `_target_`): embedded, sglang, vllm."""
    from agentrl.config.register import SCHEMAS

    return {name: engine_class(str(schema._target_)) for name, schema in SCHEMAS["inference"].items()}
