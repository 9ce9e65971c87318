"""Placeholder until SGLang lands as an inference engine."""

from __future__ import annotations

from typing import Any


class SGLangEngine:
    """Not yet available."""

    def __init__(self, model_path: str | None = None, **config: Any) -> None:
        raise NotImplementedError("inference=sglang is not yet available in this version of agentrl")
