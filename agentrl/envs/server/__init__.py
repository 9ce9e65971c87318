"""The env server: serves a bundle's episodes over the OpenEnv wire protocol."""

from agentrl.envs.server.app import build_app
from agentrl.envs.server.background import serve_in_background, start_server_in_thread

__all__ = ["build_app", "serve_in_background", "start_server_in_thread"]
