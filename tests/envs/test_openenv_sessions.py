"""Rows drawn from a remote OpenEnv env leave no session open (a real server of the installed `openenv` package).

`make_row` reads a task's opening turn (the env's reset observation is part of the prompt), which for
`env=openenv` means a WebSocket session on someone else's server. A session left open holds one of the
server's `max_concurrent_envs` slots until the server reaps it, so a run that leaked one per drawn row stopped
after about that many rows. Here the server counts its live envs (OpenEnv closes an env when its session
ends), and 1,000 rows are drawn, from threads as the trainers' rollout and eval threads do.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.openenv_remote.example import GuessEnv
from agentrl.envs.bundles.openenv_remote.remote import RemoteEnvError, RemoteSession
from agentrl.envs.server import serve_in_background
from agentrl.play.rollout import make_row

ROWS = 1000
SERVER_CAP = 64


class CountedGuessEnv(GuessEnv):
    """The documented example env, counting the instances the server holds (one per open session)."""

    lock = threading.Lock()
    live = peak = made = 0

    def __init__(self) -> None:
        super().__init__()
        self._counted = True
        with CountedGuessEnv.lock:
            CountedGuessEnv.made += 1
            CountedGuessEnv.live += 1
            CountedGuessEnv.peak = max(CountedGuessEnv.peak, CountedGuessEnv.live)

    def close(self) -> None:
        with CountedGuessEnv.lock:
            if self._counted:
                self._counted = False
                CountedGuessEnv.live -= 1
        super().close()


def _settled(deadline_s: float = 60.0) -> int:
    """Live envs once the server has finished tearing down closed sessions (a net against a slow box)."""
    end = time.monotonic() + deadline_s
    while CountedGuessEnv.live and time.monotonic() < end:
        time.sleep(0.05)
    return CountedGuessEnv.live


@pytest.mark.slow  # 1,000 real sessions: about a minute on a loaded 2-core box
def test_a_thousand_drawn_rows_leave_no_remote_session_open() -> None:
    app = create_app(CountedGuessEnv, CallToolAction, CallToolObservation, max_concurrent_envs=SERVER_CAP)
    with serve_in_background(app) as url:
        # A leaked session per row would fill the server at row 65; a short room_timeout makes that fail fast.
        bundle = load_bundle("openenv", url=url, train_size=ROWS - 24, eval_size=24, room_timeout=5)
        tasks = [("train", i) for i in range(ROWS - 24)] + [("eval", i) for i in range(24)]
        settings = {"token_var": None, "tool_timeout": 20.0}

        def draw(task: tuple[str, int]) -> dict[str, Any]:
            return make_row(bundle, task[0], task[1], "http://env.invalid", settings)

        with ThreadPoolExecutor(4) as pool:  # rows are drawn on the rollout and eval threads
            rows = list(pool.map(draw, tasks))
        assert len(rows) == ROWS
        # Each row still carries the opening turn its session read: the env's reset text and its tools.
        assert all("Find the hidden number between 1 and 8" in r["messages"][1]["content"] for r in rows)
        assert {t["function"]["name"] for t in rows[0]["metadata"]["tools"]} == {"guess"}
        assert CountedGuessEnv.made >= ROWS  # the bundle's tool probe made one more
        assert _settled() == 0, f"{CountedGuessEnv.live} remote sessions left open after {ROWS} rows"
        assert CountedGuessEnv.peak <= 4 + 1  # never more than the drawing threads at once (+ one closing)


def test_a_full_server_names_the_likely_causes() -> None:
    app = create_app(GuessEnv, CallToolAction, CallToolObservation, max_concurrent_envs=2)
    with serve_in_background(app) as url:
        bundle = load_bundle("openenv", url=url, train_size=2, eval_size=1, room_timeout=1)
        held = [RemoteSession(bundle.url, {}, timeout=20, room_timeout=1) for _ in range(2)]
        try:
            for session in held:  # another client holds every slot
                session.reset({"seed": 0})
            with pytest.raises(RemoteEnvError) as caught:
                make_row(bundle, "train", 0, "http://env.invalid", {})
        finally:
            for session in held:
                session.close()
        message = str(caught.value)
        assert caught.value.code == "CAPACITY_REACHED"
        assert "2/2 sessions active" in message  # the server's own count
        assert "sessions nobody closed" in message and "env.server.max_concurrent_envs" in message
        # With the slots freed, the same row builds.
        assert make_row(bundle, "train", 0, "http://env.invalid", {})["metadata"]["index"] == 0
