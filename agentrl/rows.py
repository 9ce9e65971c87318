"""Rows: one JSON Lines file per split of a served bundle, the prompt data of every trainer (and Miles).

    python -m agentrl.rows URL OUTDIR [--max-turns 4 --tool-timeout 60 --reset-timeout 600
                                       --connect-timeout 30 --model-timeout 600 --token-var NAME]

Each row is `{"messages": [system, user], "metadata": {"split", "index", "task_id", "tools", "url", "max_turns",
"tool_timeout", "reset_timeout", "connect_timeout", "model_timeout", "token_var"}}`. The token itself is never
written: the agent
reads it from the environment variable `token_var` names. Splits and their sizes come from the server's
`/metadata` when it lists them, else from the `splits` a reset error carries; prompts come from resetting each
task; the tools of each toolset from playing one of its tasks through every turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from agentrl.config.env import CONNECT_TIMEOUT_S, RESET_TIMEOUT_S, TOOL_TIMEOUT_S
from agentrl.envs.client import EnvResetError, EpisodeClient
from agentrl.http import async_client

_NO_SUCH_SPLIT = "\x00agentrl-rows-probe"
_MAX_LEARN_TURNS = 16


class RowsError(RuntimeError):
    """The server's splits or tasks could not be read."""


def _splits_of(listed: Any) -> dict[str, int] | None:
    if isinstance(listed, dict) and listed and all(isinstance(v, int) for v in listed.values()):
        return {str(k): int(v) for k, v in listed.items()}
    return None


async def discover_splits(url: str, *, token_var: str | None = None, reset_timeout: float = RESET_TIMEOUT_S,
                          connect_timeout: float = CONNECT_TIMEOUT_S) -> dict[str, int]:
    """Split name -> number of tasks, in the server's order (`all` first): from the server's `/metadata`, else
    from the `splits` its reset error carries when asked for a split it does not have."""
    headers = {}
    if token_var and os.environ.get(token_var):
        headers["Authorization"] = f"Bearer {os.environ[token_var]}"
    try:
        async with async_client(timeout=30) as http:
            meta = (await http.get(f"{url.rstrip('/')}/metadata", headers=headers)).json()
        found = _splits_of(meta.get("splits") if isinstance(meta, dict) else None)
        if found:
            return found
    except (httpx.HTTPError, ValueError):
        pass  # fall back to the WebSocket protocol, which every OpenEnv server speaks
    client = EpisodeClient(url, token_var=token_var, reset_timeout=reset_timeout, connect_timeout=connect_timeout)
    try:
        await client.reset(_NO_SUCH_SPLIT, 0)
    except EnvResetError as exc:
        found = _splits_of(exc.metadata.get("splits"))
        if found:
            return found
        raise RowsError(f"the server at {url} lists its splits neither in /metadata nor in its reset errors "
                        f"(it answered {exc})") from None
    finally:
        await client.close()
    raise RowsError(f"expected the server at {url} to refuse split {_NO_SUCH_SPLIT!r}, but it started it")


async def _learn_tools(client: EpisodeClient, split: str, index: int) -> list[dict[str, Any]]:
    """Every tool the task offers across its turns (ending each turn with an empty reply), end_turn last."""
    _, _, tools = await client.reset(split, index)
    seen = {t["function"]["name"]: t for t in tools}
    for _ in range(_MAX_LEARN_TURNS):
        result = await client.end_turn("")
        if result.done or not result.tools:
            break
        for t in result.tools:
            seen.setdefault(t["function"]["name"], t)
    end = seen.pop("end_turn", None)
    return [*seen.values(), *([end] if end else [])]


async def write_rows_async(url: str, outdir: str | Path, *, max_turns: int = 4, tool_timeout: float = TOOL_TIMEOUT_S,
                           reset_timeout: float = RESET_TIMEOUT_S, connect_timeout: float = CONNECT_TIMEOUT_S,
                           model_timeout: float = 600,
                           token_var: str | None = None, concurrency: int = 4) -> dict[str, Path]:
    """Write `<split>.jsonl` for every split served at `url` into `outdir`; returns split -> path."""
    if max_turns < 1 or concurrency < 1 or min(tool_timeout, reset_timeout, connect_timeout, model_timeout) <= 0:
        raise ValueError("max_turns and concurrency must be >= 1 and the timeouts positive")
    url = url.rstrip("/")
    splits = await discover_splits(url, token_var=token_var, reset_timeout=reset_timeout,
                                   connect_timeout=connect_timeout)
    settings = {"url": url, "max_turns": int(max_turns), "tool_timeout": float(tool_timeout),
                "reset_timeout": float(reset_timeout), "connect_timeout": float(connect_timeout),
                "model_timeout": float(model_timeout), "token_var": token_var}
    toolsets: dict[str, list[dict[str, Any]]] = {}
    toolset_lock = asyncio.Lock()

    async def read_split(split: str, count: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any] | None] = [None] * count
        indices = iter(range(count))

        async def worker() -> None:
            client = EpisodeClient(url, token_var=token_var, reset_timeout=reset_timeout, tool_timeout=tool_timeout,
                                   connect_timeout=connect_timeout)
            try:
                for index in indices:
                    prompt, system, _ = await client.reset(split, index)
                    task = dict(client.task or {})
                    toolset = str(task.get("toolset", "default"))
                    async with toolset_lock:
                        if toolset not in toolsets:
                            toolsets[toolset] = await _learn_tools(client, split, index)
                    rows[index] = {
                        "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
                        "metadata": {"split": split, "index": index, "task_id": task.get("id"),
                                     "tools": toolsets[toolset], **settings},
                    }
            finally:
                await client.close()

        await asyncio.gather(*(worker() for _ in range(min(concurrency, max(count, 1)))))
        return [r for r in rows if r is not None]

    named = {k: v for k, v in splits.items() if k != "all"}
    by_split = {name: await read_split(name, n) for name, n in named.items()}
    if "all" in splits:
        # `all` is every task in split order; reuse the rows read above when the ids line up.
        joined = [r for name in named for r in by_split[name]]
        if len(joined) == splits["all"] and await _same_ids(url, token_var, reset_timeout, joined):
            by_split = {"all": [_reindex(r, "all", i) for i, r in enumerate(joined)], **by_split}
        else:
            by_split = {"all": await read_split("all", splits["all"]), **by_split}
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in by_split.items():
        path = out / f"{name}.jsonl"
        with open(path, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        paths[name] = path
    return paths


def _reindex(row: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    return {"messages": row["messages"], "metadata": {**row["metadata"], "split": split, "index": index}}


async def _same_ids(url: str, token_var: str | None, reset_timeout: float, joined: list[dict[str, Any]]) -> bool:
    """Spot-check that `all` lists the named splits' tasks in order (first and last task of each split)."""
    checks = {0, len(joined) - 1}
    for i in range(1, len(joined)):
        if joined[i]["metadata"]["split"] != joined[i - 1]["metadata"]["split"]:
            checks |= {i - 1, i}
    client = EpisodeClient(url, token_var=token_var, reset_timeout=reset_timeout)
    try:
        for i in sorted(checks):
            await client.reset("all", i)
            if (client.task or {}).get("id") != joined[i]["metadata"]["task_id"]:
                return False
        return True
    finally:
        await client.close()


def write_rows(url: str, outdir: str | Path, **settings: Any) -> dict[str, Path]:
    """`write_rows_async` for synchronous callers (not from inside a running event loop)."""
    return asyncio.run(write_rows_async(url, outdir, **settings))


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of one JSON Lines file; a row without `messages` and `metadata` is an error naming its line."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc})") from None
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list) \
                    or not isinstance(row.get("metadata"), dict):
                raise ValueError(f"{path}:{n}: a row needs 'messages' (a list) and 'metadata' (an object)")
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the env server, e.g. http://127.0.0.1:8000")
    parser.add_argument("outdir")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--tool-timeout", type=float, default=TOOL_TIMEOUT_S)
    parser.add_argument("--reset-timeout", type=float, default=RESET_TIMEOUT_S)
    parser.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S,
                        help="seconds a rollout keeps trying while nothing listens at the URL")
    parser.add_argument("--model-timeout", type=float, default=600)
    parser.add_argument("--token-var", default=None, help="environment variable holding the server's token")
    parser.add_argument("--concurrency", type=int, default=4, help="episodes reset at once while reading")
    args = parser.parse_args(argv)
    try:
        paths = write_rows(args.url, args.outdir, max_turns=args.max_turns, tool_timeout=args.tool_timeout,
                           reset_timeout=args.reset_timeout, connect_timeout=args.connect_timeout,
                           model_timeout=args.model_timeout,
                           token_var=args.token_var, concurrency=args.concurrency)
    except Exception as exc:  # a CLI: say what failed, no traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(sorted(p.name for p in paths.values()))} to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
