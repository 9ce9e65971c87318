"""Run an ASGI app on uvicorn in a background thread (the trainer serves its env in-process this way).

The helpers live in `agentrl.serving`, shared with the inference session server; they are
re-exported here because callers import them from `agentrl.envs.server`.
"""

from __future__ import annotations

from agentrl.serving import serve_in_background, start_server_in_thread

__all__ = ["serve_in_background", "start_server_in_thread"]
