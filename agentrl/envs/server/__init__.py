"""The env server: serves a bundle's episodes over the OpenEnv wire protocol. `serve_in_background` and
`start_server_in_thread` (from `agentrl.uvicorn_servers`, shared with the inference session server) serve it from a thread,
as the trainer does."""

from agentrl.envs.server.app import build_app
from agentrl.uvicorn_servers import serve_in_background, start_server_in_thread

__all__ = ["build_app", "serve_in_background", "start_server_in_thread"]
