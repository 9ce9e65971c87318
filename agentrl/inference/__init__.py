"""Inference: the embedded engine, the token-in/token-out session server and sample assembly.

Imports are lazy so `import agentrl.inference` stays cheap (no torch / fastapi until used).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "EmbeddedEngine": "agentrl.inference.engine",
    "Completion": "agentrl.inference.engine",
    "EngineStats": "agentrl.inference.engine",
    "EngineUnavailable": "agentrl.inference.completion",
    "build_session_app": "agentrl.inference.sessions",
    "SessionStore": "agentrl.inference.sessions",
    "SessionServer": "agentrl.inference.server",
    "start_session_server": "agentrl.inference.server",
    "Sample": "agentrl.inference.samples",
    "assemble_sample": "agentrl.inference.samples",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'agentrl.inference' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
