"""The session server over the embedded engine, in a process of its own, logging every forward pass.

    python benchmarks/micro/embedded_forward_log.py MODEL_FOLDER PORT [THREADS [DTYPE]]

bench_vllm.py starts it beside a vLLM server so both engines answer the same OpenAI chats over a socket, each in
its own process. Besides the session API it serves `GET /bench/forwards`: the forward passes since the last call
(kind prefill|decode, rows, padded width, seconds each), which is how bench_vllm.py shows where the embedded
engine's time goes as sessions grow. Timing a pass costs two perf_counter calls: nothing next to a forward.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agentrl.inference.engines.embedded.engine import EmbeddedEngine  # noqa: E402
from agentrl.inference.sessions.server import SessionServer  # noqa: E402


class ForwardLog:
    """Wraps an engine's `_forward`; holds one (kind, rows, width, seconds) row per pass until taken."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.rows: list[tuple[str, int, int, float]] = []
        self.lock = threading.Lock()
        forward = engine._forward

        def timed(ids: Any, mask: Any, pos: Any, cache: Any, prefix: Any = None) -> Any:
            t0 = time.perf_counter()
            out = forward(ids, mask, pos, cache, prefix)
            kind = "decode" if ids.shape[1] == 1 else "prefill"  # prompts here are never one token long
            with self.lock:
                self.rows.append((kind, int(ids.shape[0]), int(mask.shape[1]), time.perf_counter() - t0))
            return out

        engine._forward = timed  # type: ignore[method-assign]

    def take(self) -> list[tuple[str, int, int, float]]:
        with self.lock:
            rows, self.rows = self.rows, []
        return rows


def main() -> None:
    model, port = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3 and int(sys.argv[3]) > 0:  # torch threads (default: torch's own, the cores)
        import torch

        torch.set_num_threads(int(sys.argv[3]))
    dtype = sys.argv[4] if len(sys.argv) > 4 else "auto"  # the engine's inference.dtype
    engine = EmbeddedEngine(model, max_batch_sequences=64, dtype=dtype)
    log = ForwardLog(engine)
    server = SessionServer(engine, port=port, default_max_tokens=96)
    server.app.add_api_route("/bench/forwards", lambda: {"forwards": log.take()}, methods=["GET"])
    server.start()
    print(f"embedded session server for {model} on {server.base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        engine.close(timeout=1.0)


if __name__ == "__main__":
    main()
