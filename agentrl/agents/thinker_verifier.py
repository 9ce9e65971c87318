"""Placeholder until the agent patterns land: accepts its config so plans compose and validate."""

from __future__ import annotations

from typing import Any


class ThinkerVerifierAgent:
    """Not yet available."""

    def __init__(self, **config: Any) -> None:
        self.config = config

    async def run(self, base_url: str, prompt: Any, request_kwargs: dict, metadata: dict, **kw: Any) -> dict:
        raise NotImplementedError("agent pattern 'thinker_verifier' is not yet available in this version of agentrl")
