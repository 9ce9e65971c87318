"""Run the session server in-process, on a background thread, next to a trainer.

    engine = EmbeddedEngine(model_path)
    server = start_session_server(engine, port=0)          # 0 picks a free port
    sid = server.create_session()
    await agent.run(base_url=server.session_url(sid), ...)  # OpenAI client at f"{base_url}/v1"
    sample = server.sample(sid, reward=r, group_id=g)      # then server.delete_session(sid)
    server.stop(); engine.close()
"""

from __future__ import annotations

from typing import Any

from agentrl.inference.sessions.app import MAX_BODY_BYTES, SessionStore, build_session_app
from agentrl.inference.sessions.samples import Sample, assemble_sample
from agentrl.uvicorn_servers import ThreadedServer


class SessionServer:
    """A uvicorn server for `build_session_app(engine, tokenizer)` on its own thread and event loop."""

    def __init__(self, engine: Any, tokenizer: Any = None, *, host: str = "127.0.0.1", port: int = 0,
                 default_max_tokens: int = 512, log_level: str = "warning", tool_format: str = "qwen",
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.engine = engine
        self.sessions = SessionStore()
        self.app = build_session_app(engine, tokenizer, default_max_tokens=default_max_tokens, store=self.sessions,
                                     tool_format=tool_format, max_body_bytes=max_body_bytes)
        # a turn stuck on a wedged engine must not hold `stop()` past its timeout
        self._server = ThreadedServer(self.app, host, port, log_level=log_level, lifespan="off", access_log=False,
                                      timeout_graceful_shutdown=5, on_shutdown=self.app.state.drain.begin)
        self.host = host
        self.port = int(port)

    def start(self, timeout: float = 30.0) -> SessionServer:
        """Start serving; returns once the socket accepts connections."""
        try:
            self._server.start(timeout)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"the session server did not start on {self.host}:{self.port}: {exc}") from exc
        self.port = self._server.port
        return self

    @property
    def base_url(self) -> str:
        return self._server.url

    def create_session(self) -> str:
        """A new session id (the same as `POST /sessions`)."""
        return self.sessions.create()

    def session_url(self, session_id: str) -> str:
        """The agent's `base_url` for a session; its OpenAI endpoint is `{session_url}/v1/chat/completions`."""
        return f"{self.base_url}/sessions/{session_id}"

    def records(self, session_id: str) -> list[dict[str, Any]]:
        return self.sessions.records(session_id)

    def sample(self, session_id: str, **kwargs: Any) -> Sample:
        """`assemble_sample` over the session's records; kwargs go to it (reward, group_id, metadata)."""
        return assemble_sample(self.sessions.records(session_id), **kwargs)

    def delete_session(self, session_id: str) -> None:
        self.sessions.delete(session_id)

    def stop(self, timeout: float = 10.0) -> None:
        self._server.stop(timeout)
        self.app.state.prompts.close()

    def __enter__(self) -> SessionServer:
        return self if self._server.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_session_server(engine: Any, tokenizer: Any = None, *, host: str = "127.0.0.1", port: int = 0,
                         default_max_tokens: int = 512, tool_format: str = "qwen",
                         max_body_bytes: int = MAX_BODY_BYTES) -> SessionServer:
    """Build and start a `SessionServer`; `port=0` picks a free port (see `.port`, `.base_url`); `tool_format`
    is `model.tool_format`."""
    return SessionServer(engine, tokenizer, host=host, port=port, default_max_tokens=default_max_tokens,
                         tool_format=tool_format, max_body_bytes=max_body_bytes).start()
