"""Inference: the engines (`engines/`: embedded, vLLM, SGLang), the token-in/token-out session server and sample
assembly (`sessions/`), `python -m agentrl.inference.serve` (`serve.py`) and the SFT assistant mask
(`assistant_tokens.py`).

Imports are lazy so `import agentrl.inference` stays cheap (no torch / fastapi until used).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "EmbeddedEngine": "agentrl.inference.engines.embedded.engine",
    "Completion": "agentrl.inference.engines.embedded.engine",
    "EngineStats": "agentrl.inference.engines.embedded.engine",
    "EngineUnavailable": "agentrl.inference.engines.completion",
    "build_session_app": "agentrl.inference.sessions.app",
    "SessionStore": "agentrl.inference.sessions.app",
    "SessionServer": "agentrl.inference.sessions.server",
    "start_session_server": "agentrl.inference.sessions.server",
    "Sample": "agentrl.inference.sessions.samples",
    "assemble_sample": "agentrl.inference.sessions.samples",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'agentrl.inference' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
