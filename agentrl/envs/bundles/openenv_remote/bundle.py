"""`env=openenv`: someone else's OpenEnv server played as a bundle.

The bundle is a thin proxy: each episode opens one WebSocket session on the remote server (`env.url`) and
relays the agent's tool calls to it, so our env server, every trainer, the rows for Miles and every agent
play it unchanged. Two shapes of remote env are played:

* `tools`: an env with MCP tools (OpenEnv's `MCPEnvironment`, or any env taking `list_tools` and
  `call_tool` actions). The tools are discovered (or named in `env.tools`); each call is a `call_tool` step.
* `actions`: an env with a typed step action. One tool, `env.action_tool` (default `act`), takes the
  action's fields, its JSON schema read from the server's `/schema`.

The reward is what the env returns (its last reward, or the sum of all with `reward_mode=sum`). Ending the
turn before the env says done ends the episode with the reward so far. Tasks come from `env.tasks` (a JSONL
file of `{"split", "prompt", "system_prompt", "reset": {...}, "task_id"}` rows) or from seeds: `train_size`
and `eval_size` resets with `{seed_key: seed + i}`, the eval seeds after the train seeds (no overlap).
`env.teacher` names a scripted policy whose real plays of the server are the warm start's demonstrations
(`teacher.py`); `env.serve` names an app to serve here when `env.url` is null (the example's, in its recipe), or an OpenEnv
environment folder whose `openenv.yaml` says where its app is (`local_app.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.envs.bundles.openenv_remote.local_app import LocalApp, local_app
from agentrl.envs.bundles.openenv_remote.remote import (
    RemoteEnvError,
    RemoteSession,
    auth_headers,
    base_url,
    probe,
)
from agentrl.envs.bundles.openenv_remote.teacher import load_policy, play_demonstration
from agentrl.envs.task import Bundle, Episode, TaskInfo, ToolResult, Turn

DEFAULT_SYSTEM = "You act in an environment through its tools. Call them until the task is done."
MCP_ACTION_FIELDS = {"tool_name"}  # an action schema with these properties is openenv's CallToolAction
_OBS_HIDDEN = {"metadata", "reward", "done"}
RESERVED = {"reset", "step", "state", "close", "end_turn"}  # OpenEnv's reserved names and our end_turn


def openai_function(name: str, description: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": parameters or {"type": "object", "properties": {}}}}


def observation_text(observation: dict[str, Any]) -> str:
    """What the agent reads of an observation: its one text field, or its fields as JSON ('' when empty)."""
    shown = {k: v for k, v in (observation or {}).items() if k not in _OBS_HIDDEN}
    if not shown:
        return ""
    texts = [v for v in shown.values() if isinstance(v, str)]
    if len(shown) == 1 and texts:
        return texts[0]
    return json.dumps(shown, sort_keys=True, default=str)


def result_text(observation: dict[str, Any]) -> tuple[str, bool]:
    """(text, is_error) of a call_tool observation: the tool's data or text content, or its error message."""
    error, result = observation.get("error"), observation.get("result")
    if error:
        return str(error.get("message") if isinstance(error, dict) else error), True
    if isinstance(result, dict):
        if result.get("data") is not None:
            data = result["data"]
            return (data if isinstance(data, str) else json.dumps(data, default=str)), bool(result.get("is_error"))
        texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict)]
        return "\n".join(texts), bool(result.get("is_error"))
    return ("" if result is None else result if isinstance(result, str) else json.dumps(result, default=str)), False


def read_tasks(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A task list (JSON Lines) by split; a row without `split` is a train task."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"env.tasks={path}: no such file")
    by_split: dict[str, list[dict[str, Any]]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"env.tasks={path}:{n}: not JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("reset", {}), dict):
            raise ValueError(f"env.tasks={path}:{n}: a task is an object whose `reset` (if any) is an object")
        by_split.setdefault(str(row.get("split", "train")), []).append(row)
    if not by_split:
        raise ValueError(f"env.tasks={path} has no tasks")
    return by_split


def serve_locally(spec: str) -> tuple[str, LocalApp]:
    """(base URL, the app) of what `env.serve` names (an OpenEnv environment folder with its openenv.yaml, or
    `package.module:function` returning an ASGI app, e.g. the example's `app`), served on a free local port in a
    daemon thread for as long as this process runs."""
    from agentrl.uvicorn_servers import start_server_in_thread

    served = local_app(spec)
    url, _ = start_server_in_thread(served.app, "127.0.0.1", 0)
    return url, served


class OpenEnvEpisode(Episode):
    """One remote session: reset on the first turn, each tool call one remote step."""

    def __init__(self, bundle: OpenEnvBundle, task: dict[str, Any], info: TaskInfo) -> None:
        self.bundle, self.task, self.info = bundle, task, info
        self.session = RemoteSession(bundle.url, bundle.headers, timeout=bundle.step_timeout,
                                     room_timeout=bundle.room_timeout)
        self.rewards: list[float] = []
        self._done = False

    def first_turn(self) -> Turn:
        data = self.session.reset(dict(self.task.get("reset") or {}))
        self._note(data)
        if self.bundle.mode == "tools":
            found = {t["name"]: t for t in self.session.list_tools()}
            tools = [openai_function(t["name"], t.get("description", ""),
                                     t.get("input_schema") or t.get("inputSchema")) for t in found.values()
                     if self.bundle.tool_names is None or t["name"] in self.bundle.tool_names]
            tools = tools or self.bundle.tools  # a session that lists none keeps the discovered ones
        else:
            tools = self.bundle.tools
        prompt = "\n\n".join(p for p in (self.task.get("prompt") or self.bundle.prompt,
                                         observation_text(data.get("observation") or {})) if p)
        return Turn(prompt=prompt, system_prompt=self.task.get("system_prompt") or self.bundle.system_prompt,
                    tools=tools)

    def _note(self, data: dict[str, Any]) -> None:
        reward = data.get("reward")
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            self.rewards.append(float(reward))
        elif isinstance(reward, bool):
            self.rewards.append(float(reward))
        if data.get("done"):
            self._done = True

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self._done:
            return ToolResult("the episode is over", is_error=True, done=True)
        if self.bundle.mode == "tools":
            action = {"type": "call_tool", "tool_name": name, "arguments": arguments}
        elif name == self.bundle.action_tool:
            action = dict(arguments)
        else:
            return ToolResult(f"unknown tool {name!r}; call {self.bundle.action_tool}", is_error=True)
        try:
            data = self.session.step(action)
        except RemoteEnvError as exc:
            if exc.code != "VALIDATION_ERROR":
                raise  # the env itself failed: the server flags the episode (env_error)
            return ToolResult(f"invalid action: {exc}", is_error=True)  # the agent's arguments were wrong
        self._note(data)
        observation = data.get("observation") or {}
        if self.bundle.mode == "tools":
            text, is_error = result_text(observation)
        else:
            text, is_error = observation_text(observation), False
        return ToolResult(text, is_error=is_error, done=self._done)

    def end_turn(self, response: str) -> Turn | None:
        self._done = True  # the remote env has no turns of ours: ending one ends the episode
        return None

    @property
    def done(self) -> bool:
        return self._done

    def scores(self) -> dict[str, float]:
        if not self._done:
            return {}
        if not self.rewards:
            return {"reward": 0.0}
        return {"reward": sum(self.rewards) if self.bundle.reward_mode == "sum" else self.rewards[-1]}

    def close(self) -> None:
        self.session.close()


class OpenEnvBundle(Bundle):
    """A remote OpenEnv server's env, its tasks from a task list or from seeds."""

    def __init__(self, url: str | None = None, *, token_var: str | None = None, tools: list[Any] | None = None,
                 mode: str = "auto", action_tool: str = "act", tasks: str | None = None, train_size: int = 64,
                 eval_size: int = 32, seed: int = 0, seed_key: str = "seed", prompt: str = "",
                 system_prompt: str = DEFAULT_SYSTEM, reward_mode: str = "last", connect_timeout: float = 10.0,
                 step_timeout: float = 60.0, room_timeout: float = 120.0, train_split: str = "train",
                 eval_split: str = "eval", teacher: str | None = None, serve: str | None = None) -> None:
        served = None
        if not url and serve:
            url, served = serve_locally(serve)
        if not url:
            raise ValueError("env.url is not set: give the OpenEnv server's base URL, e.g. "
                             "env.url=http://127.0.0.1:8000 (or env.serve=package.module:app to start one here)")
        if mode not in ("auto", "tools", "actions"):
            raise ValueError(f"env.mode must be auto, tools or actions, not {mode!r}")
        if action_tool in RESERVED:
            raise ValueError(f"env.action_tool={action_tool!r} is a name OpenEnv reserves ({sorted(RESERVED)})")
        if reward_mode not in ("last", "sum"):
            raise ValueError(f"env.reward_mode must be last or sum, not {reward_mode!r}")
        self.url = base_url(url)
        self.options = {"url": self.url, "token_var": token_var, "tools": tools, "mode": mode,
                        "action_tool": action_tool, "tasks": tasks, "train_size": train_size,
                        "eval_size": eval_size, "seed": seed, "seed_key": seed_key, "prompt": prompt,
                        "system_prompt": system_prompt, "reward_mode": reward_mode,
                        "connect_timeout": connect_timeout, "step_timeout": step_timeout,
                        "room_timeout": room_timeout, "teacher": teacher}
        # A server started here has a new port each time: the data (and the warm start's cache key) is the app's.
        self._data_url = served.key if served else self.url
        self.headers = auth_headers(token_var)
        # A scripted policy named by env.teacher plays the demonstrations: the bundle's one teacher, by its name.
        self._policy = None
        if teacher:
            name, self._policy = load_policy(teacher)
            self.teachers = (name,)
        self.action_tool, self.prompt, self.system_prompt = action_tool, prompt, system_prompt
        self.reward_mode, self.step_timeout, self.room_timeout = reward_mode, float(step_timeout), float(room_timeout)
        self.train_split, self.eval_split = train_split, eval_split
        self._tasks = self._make_tasks(tasks, train_size, eval_size, seed, seed_key)
        schema, meta = probe(self.url, self.headers, float(connect_timeout))  # unreachable: fails now
        self.name = "openenv"
        self.version = str(meta.get("version") or "0")
        # An environment folder's manifest names it (its server's /metadata says only the class's name).
        self.env_name = (served and served.name) or str(meta.get("name") or "remote")
        self.tool_names: set[str] | None = None
        self.mode, self.tools = self._discover(mode, tools, schema.get("action") or {})

    @staticmethod
    def _make_tasks(tasks: str | None, train: int, eval_: int, seed: int,
                    seed_key: str) -> dict[str, list[dict[str, Any]]]:
        if tasks:
            return read_tasks(tasks)
        if train < 1 or eval_ < 1:
            raise ValueError(f"env.train_size and env.eval_size must be >= 1 (got {train}, {eval_})")
        # Eval seeds follow the train seeds, so the two splits never share a task.
        return {"train": [{"reset": {seed_key: seed + i}} for i in range(train)],
                "eval": [{"reset": {seed_key: seed + train + i}} for i in range(eval_)]}

    def _discover(self, mode: str, tools: list[Any] | None,
                  action_schema: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """(mode, OpenAI tool schemas): MCP tools from a probe session, else the typed action as one tool."""
        given = [t for t in tools or [] if isinstance(t, dict)]
        self.tool_names = {t for t in tools or [] if isinstance(t, str)} or None
        typed = bool(action_schema.get("properties")) and not MCP_ACTION_FIELDS <= set(action_schema["properties"])
        if mode in ("auto", "tools") and not given:
            found = self._probe_tools()
            if self.tool_names is not None:
                missing = sorted(self.tool_names - {t["name"] for t in found})
                if missing:
                    raise ValueError(f"env.tools names {missing}, which the env at {self.url} does not offer "
                                     f"(it offers {sorted(t['name'] for t in found)})")
                found = [t for t in found if t["name"] in self.tool_names]
            if found:
                return "tools", [openai_function(t["name"], t.get("description", ""),
                                                 t.get("input_schema") or t.get("inputSchema")) for t in found]
        if given:
            return "tools", [t if t.get("type") == "function" else
                             openai_function(t["name"], t.get("description", ""),
                                             t.get("input_schema") or t.get("parameters")) for t in given]
        if mode in ("auto", "actions") and typed:
            params = {k: v for k, v in action_schema.items() if k not in ("title", "description")}
            params["properties"] = {k: v for k, v in params["properties"].items() if k != "metadata"}
            desc = action_schema.get("description") or f"Take one step in the {self.env_name} environment."
            return "actions", [openai_function(self.action_tool, desc, params)]
        raise ValueError(f"env.url={self.url}: the env offers no tools (list_tools found none) and no typed "
                         f"step action in /schema; name its tools in env.tools, or use env.mode=actions for an "
                         f"env with a typed action")

    def _probe_tools(self) -> list[dict[str, Any]]:
        first = next(iter(self._tasks.values()))[0]
        session = RemoteSession(self.url, self.headers, timeout=self.step_timeout, room_timeout=self.room_timeout)
        try:
            session.reset(dict(first.get("reset") or {}))
            return session.list_tools()
        except RemoteEnvError as exc:
            raise ValueError(f"env.url={self.url}: discovering the tools failed: {exc}") from exc
        finally:
            session.close()

    def splits(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self._tasks.items()}

    def _task(self, split: str, index: int) -> dict[str, Any]:
        rows = self._tasks[split]
        if not isinstance(index, int) or not 0 <= index < len(rows):
            raise IndexError(f"split {split!r} has no task {index!r} (0..{len(rows) - 1})")
        return rows[index]

    def task_info(self, split: str, index: int) -> TaskInfo:
        task = self._task(split, index)
        return TaskInfo(task_id=str(task.get("task_id") or f"{self.env_name}-{split}-{index}"), split=split,
                        index=index)

    def episode(self, split: str, index: int) -> OpenEnvEpisode:
        return OpenEnvEpisode(self, self._task(split, index), self.task_info(split, index))

    def spec(self) -> dict[str, Any]:
        return {"bundle": "openenv", "train_split": self.train_split, "eval_split": self.eval_split,
                **self.options}

    def data_options(self) -> dict[str, Any]:
        return {**self.options, "url": self._data_url}

    def demonstration(self, split: str, index: int, teacher: str) -> list[dict[str, Any]]:
        """Task `index` of `split` played on the remote server by the `env.teacher` policy (a real play: its
        reset, its tool calls and the env's answers), as the tool-calling agent's chat."""
        if self._policy is None or teacher not in self.teachers:
            raise ValueError(f"teacher {teacher!r}: env=openenv offers {', '.join(self.teachers) or 'no teachers'} "
                             "(name a scripted policy with env.teacher=package.module:function)")
        messages, _ = play_demonstration(self.episode(split, index), self._policy, f"{split}/{index}")
        return messages
