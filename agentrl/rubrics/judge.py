"""`Judge`: OpenEnv's `LLMJudge` over any OpenAI-compatible endpoint (a vLLM server, an OpenAI API, or an agentrl
session server), with a bound on requests in flight, a timeout and retries per call, and a cache keyed by
(prompt, answer). A judge that cannot give a score raises `JudgeError`: the reward group flags the rollout
(`judge_error`) and its group is dropped, rather than training on a made-up 0.
"""

from __future__ import annotations

import asyncio
import math
import string
import time
from typing import Any

import httpx
from openenv.core.llm_client import LLMClient
from openenv.core.rubrics import LLMJudge

from agentrl.config.reward import JudgeConfig as D  # the defaults' one home
from agentrl.http import async_client


class JudgeError(RuntimeError):
    """The judge endpoint timed out, failed, or answered without a score, on every attempt."""


class JudgeStats:
    """Counters of one judge: calls made, cache hits, failures, and the seconds a call was in flight."""

    def __init__(self) -> None:
        self.calls = self.failed_calls = self.lookups = self.hits = self.failures = 0
        self.busy_s = 0.0
        self._in_flight, self._since = 0, 0.0

    def start(self) -> None:
        if self._in_flight == 0:
            self._since = time.monotonic()
        self._in_flight += 1

    def stop(self, ok: bool) -> None:
        self._in_flight -= 1
        self.calls += 1
        self.failed_calls += not ok
        if self._in_flight == 0:
            self.busy_s += time.monotonic() - self._since

    def metrics(self, prefix: str) -> dict[str, float]:
        """`<prefix>/calls`, `/calls_per_s` (while any call was in flight), `/cache_hit_rate`, `/failures`."""
        return {f"{prefix}/calls": float(self.calls), f"{prefix}/failures": float(self.failures),
                f"{prefix}/calls_per_s": self.calls / self.busy_s if self.busy_s > 0 else 0.0,
                f"{prefix}/cache_hit_rate": self.hits / self.lookups if self.lookups else 0.0}


class JudgeClient(LLMClient):
    """OpenEnv's `LLMClient` for an OpenAI-compatible chat endpoint, `batch_size` requests in flight at most."""

    def __init__(self, url: str, *, session_server: bool, model: str | None, max_tokens: int, temperature: float,
                 timeout_s: float, batch_size: int, stats: JudgeStats) -> None:
        super().__init__(url, None)
        self.url = url.rstrip("/")
        self.session_server, self.model = session_server, model
        self.max_tokens, self.temperature, self.timeout_s = max_tokens, temperature, timeout_s
        self.batch_size, self.stats = batch_size, stats
        self._slots: dict[Any, asyncio.Semaphore] = {}  # per event loop (a TRL step runs its own)

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots = {loop: asyncio.Semaphore(self.batch_size)}
        return self._slots[loop]

    async def complete(self, prompt: str, **kwargs: Any) -> str:
        """The endpoint's reply text to `prompt` (one user message); JudgeError when there is none."""
        body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": self.max_tokens,
                                "temperature": self.temperature, **kwargs}
        if self.model:
            body["model"] = self.model
        async with self._slot():
            self.stats.start()
            ok = False
            try:
                async with asyncio.timeout(self.timeout_s), async_client() as client:
                    reply = await self._post(client, body)
                ok = True
                return reply
            except TimeoutError:
                raise JudgeError(f"no reply within timeout_s={self.timeout_s:g}") from None
            except httpx.HTTPError as exc:
                raise JudgeError(f"{type(exc).__name__}: {exc}") from None
            finally:
                self.stats.stop(ok)

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> str:
        base, session = self.url, None
        if self.session_server:  # an agentrl session server answers only inside a session
            opened = await client.post(f"{self.url}/sessions")
            session = _json(opened, "POST /sessions").get("session_id")
            if not isinstance(session, str):
                raise JudgeError(f"POST {self.url}/sessions gave no session_id: {opened.text[:200]!r}")
            base = f"{self.url}/sessions/{session}"
        try:
            response = await client.post(f"{base}/v1/chat/completions", json=body)
            data = _json(response, "the chat completion")
        finally:
            if session is not None:
                await client.delete(base)
        try:
            message = data["choices"][0]["message"]
            content, calls = message.get("content"), message.get("tool_calls") or []
        except (KeyError, IndexError, TypeError, AttributeError):
            raise JudgeError(f"not an OpenAI chat completion: {str(data)[:200]!r}") from None
        if content is not None and not isinstance(content, str):
            raise JudgeError(f"the reply's content is {type(content).__name__}, not text")
        if not content and isinstance(calls, list):
            # A model tuned on tool calls may answer with one even when offered no tools: read its arguments.
            return " ".join(str((c.get("function") or {}).get("arguments") or "") for c in calls if isinstance(c, dict))
        return content or ""


def _json(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code != 200:
        raise JudgeError(f"{what}: HTTP {response.status_code}: {response.text[:200]!r}")
    try:
        data = response.json()
    except ValueError:
        raise JudgeError(f"{what}: not JSON: {response.text[:200]!r}") from None
    if not isinstance(data, dict):
        raise JudgeError(f"{what}: not a JSON object: {response.text[:200]!r}")
    return data


def _check_template(prompt: str) -> None:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None}
    except ValueError as exc:
        raise ValueError(f"prompt: not a format string: {exc}") from None
    if unknown := sorted(fields - {"prompt", "answer"}):
        raise ValueError(f"prompt: unknown placeholder {{{unknown[0]}}}; it may use {{prompt}} and {{answer}}")
    if "answer" not in fields:
        raise ValueError("prompt: it must show the judge the {answer}")


class Judge(LLMJudge):
    """An LLM judge of the rollout's answer to the task's prompt: the first `score_pattern` match of the reply,
    clamped to [0, 1]. Each (prompt, answer) is asked once (`cache`); concurrent asks of the same one share it."""

    def __init__(self, url: str, *, session_server: bool = D.session_server, model: str | None = D.model,
                 prompt: str = D.prompt, score_pattern: str = D.score_pattern, max_tokens: int = D.max_tokens,
                 temperature: float = D.temperature, timeout_s: float = D.timeout_s, retries: int = D.retries,
                 batch_size: int = D.batch_size, cache: bool = D.cache) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url={url!r}: the judge's endpoint is an http(s) URL")
        if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s!r}: a number of seconds > 0")
        for key, value, least in (("retries", retries, 0), ("batch_size", batch_size, 1), ("max_tokens", max_tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{key}={value!r}: an integer >= {least}")
        _check_template(prompt)
        self.stats = JudgeStats()
        client = JudgeClient(url, session_server=bool(session_server), model=model, max_tokens=max_tokens,
                             temperature=float(temperature), timeout_s=float(timeout_s), batch_size=batch_size,
                             stats=self.stats)
        try:
            super().__init__(prompt, client, score_pattern=score_pattern, normalize=True)
        except Exception as exc:  # noqa: BLE001 - re.error: name the key
            raise ValueError(f"score_pattern={score_pattern!r}: {exc}") from None
        self.url, self.retries, self.cache = client.url, retries, bool(cache)
        self._known: dict[tuple[str, str], float] = {}
        self._asking: dict[tuple[str, str], asyncio.Future[float]] = {}

    def _render_prompt(self, action: Any, observation: Any) -> str:
        return self.prompt_template.format(prompt=observation.prompt, answer=action)

    def _strict_score(self, reply: str) -> float | None:
        match = self._score_pattern.search(reply)
        if match is None:
            return None
        try:
            score = float(match.group(1) if match.lastindex else match.group(0))
        except (ValueError, IndexError):
            return None
        return max(0.0, min(1.0, score)) if math.isfinite(score) else None

    async def forward(self, action: Any, observation: Any) -> float:
        key = (str(observation.prompt), str(action))
        if not self.cache:
            return await self._ask(key, action, observation)
        self.stats.lookups += 1
        if key in self._known:
            self.stats.hits += 1
            return self._known[key]
        if key in self._asking and self._asking[key].get_loop() is asyncio.get_running_loop():
            self.stats.hits += 1
            return await asyncio.shield(self._asking[key])
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        try:
            score = await self._ask(key, action, observation)
            self._known[key] = score
            future.set_result(score)
            return score
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # marked retrieved: nobody may be waiting on it
            raise
        finally:
            self._asking.pop(key, None)

    async def _ask(self, key: tuple[str, str], action: Any, observation: Any) -> float:
        text = self._render_prompt(action, observation)
        last = ""
        for _ in range(self.retries + 1):
            try:
                reply = await self._client.complete(text)
            except JudgeError as exc:
                last = str(exc)
                continue
            score = self._strict_score(reply)
            if score is not None:
                return score
            last = f"the reply holds no score ({self._score_pattern.pattern}): {reply[:200]!r}"
        self.stats.failures += 1
        raise JudgeError(f"the judge at {self.url} gave no score in {self.retries + 1} attempts; last: {last}")
