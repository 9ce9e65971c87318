"""Runs inside a sandbox container (standard library only): loads the bundle, then plays one episode.

It connects to the host's unix socket (bind-mounted into the container), says hello with its token once the
bundle is loaded (a warm container then just waits), and answers requests, one JSON object per line:

    -> {"op": "episode", "split": "train", "index": 3}     <- {"ok": true, "result": {"task_id": "..."}}
    -> {"op": "first_turn"} / {"op": "call_tool", "name": ..., "arguments": {...}} / {"op": "end_turn",
       "response": ...} / {"op": "done"} / {"op": "scores"} / {"op": "close"}
    <- {"ok": true, "result": ...} or {"ok": false, "error": "TypeName: message", "traceback": "..."}

The host closing the connection ends the process (and so the container).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import socket
import sys
import traceback
from typing import Any

DEFAULT_LOADER = "agentrl.envs.bundles:load_bundle"


def resolve_loader(loader: str):
    """`module:function` or `/abs/file.py:function` -> the callable that builds the bundle from the spec."""
    target, _, attr = loader.rpartition(":")
    if not target or not attr:
        raise ValueError(f"loader must look like 'module:function' or '/path/file.py:function', got {loader!r}")
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_agentrl_loader_{abs(hash(target))}", target)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, attr)


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}


class Agent:
    """One bundle, at most one episode."""

    def __init__(self, bundle: Any) -> None:
        self.bundle = bundle
        self.episode: Any = None

    def handle(self, req: dict[str, Any]) -> Any:
        op = req.get("op")
        if op == "episode":
            if self.episode is not None:
                raise RuntimeError("this container already plays an episode")
            self.episode = self.bundle.episode(req["split"], int(req["index"]))
            return {"task_id": self.episode.info.task_id}
        ep = self.episode
        if ep is None:
            raise RuntimeError(f"no episode yet (op {op!r})")
        if op == "first_turn":
            return _plain(ep.first_turn())
        if op == "call_tool":
            return _plain(ep.call_tool(req["name"], req.get("arguments") or {}))
        if op == "end_turn":
            return _plain(ep.end_turn(req["response"]))
        if op == "done":
            return bool(ep.done)
        if op == "scores":
            return {k: float(v) for k, v in ep.scores().items()}
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    token = os.environ["AGENTRL_TOKEN"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ.get("AGENTRL_SOCKET", "/run/agentrl/host.sock"))
    rfile, wfile = sock.makefile("rb"), sock.makefile("wb")

    def send(msg: dict[str, Any]) -> None:
        wfile.write(json.dumps(msg).encode() + b"\n")
        wfile.flush()

    try:
        spec = json.loads(os.environ["AGENTRL_BUNDLE_SPEC"])
        bundle = resolve_loader(os.environ.get("AGENTRL_BUNDLE_LOADER", DEFAULT_LOADER))(**spec)
    except Exception as exc:  # reported to the host, which fails the deploy with this message
        send({"hello": token, **_error(exc)})
        return 1
    if os.environ.get("AGENTRL_PRELOAD") == "1":
        # A warm container has time to spare: read every split now so its task assignment is one round trip.
        for split in bundle.splits():
            try:
                bundle.task_info(split, 0)
            except Exception:  # an empty or odd split is the episode's business, not the warm-up's
                pass
    send({"hello": token, "ok": True})
    agent = Agent(bundle)
    for line in rfile:
        try:
            req = json.loads(line)
        except ValueError as exc:
            send(_error(exc))
            continue
        if req.get("op") == "close":
            send({"ok": True, "result": None})
            break
        try:
            send({"ok": True, "result": agent.handle(req)})
        except Exception as exc:  # the episode's own error goes back to the host, the container lives on
            send(_error(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
