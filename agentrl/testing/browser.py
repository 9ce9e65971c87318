"""Headless Chromium (Debian's `chromium` package) driven over its DevTools protocol: no Playwright, no browser
download. `scripts/mlflow_screenshots.py` takes the docs' screenshots with it, and the MLflow run-page test
(`tests/tracking/test_run_page_first_screen.py`) asserts on what a page shows.

    with Chromium(size=(1600, 1000)) as browser:
        async def look() -> bytes:
            async with browser.page() as page:
                await page.open(url, settle_s=20)
                return await page.screenshot()
        png = asyncio.run(look())
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import websockets

# What Chromium needs on a machine with no screen, no GPU and a closed network (no background fetches).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium_path() -> str | None:
    """The Chromium executable on PATH (`chromium`, else `chromium-browser`), None when there is none."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DevToolsError(RuntimeError):
    """Chromium answered a DevTools call with an error, or a page script threw."""


class Page:
    """One browser tab over its DevTools WebSocket: `call` any protocol method, or the helpers below."""

    def __init__(self, ws: Any, size: tuple[int, int]) -> None:
        self._ws = ws
        self._seq = 0
        self.size = size

    async def call(self, method: str, **params: Any) -> dict:
        """Send one DevTools command and return its result (events arriving meanwhile are skipped)."""
        self._seq += 1
        seq = self._seq
        await self._ws.send(json.dumps({"id": seq, "method": method, "params": params}))
        while True:
            msg = json.loads(await self._ws.recv())
            if msg.get("id") == seq:
                if "error" in msg:
                    raise DevToolsError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def evaluate(self, script: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values come back as Python values)."""
        result = await self.call("Runtime.evaluate", expression=script, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"page script threw: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def open(self, url: str, settle_s: float = 0.0) -> None:
        """Navigate to `url` at this page's viewport size, then give it `settle_s` seconds to fetch and draw."""
        await self.call("Page.enable")
        await self.call("Emulation.setDeviceMetricsOverride", width=self.size[0], height=self.size[1],
                        deviceScaleFactor=1, mobile=False)
        await self.call("Page.navigate", url=url)
        if settle_s:
            await asyncio.sleep(settle_s)

    async def wait_for(self, script: str, timeout_s: float, poll_s: float = 1.0) -> Any:
        """Evaluate `script` every `poll_s` seconds until it returns something truthy (returned); after
        `timeout_s`, its last value (falsy). A script that throws meanwhile (the page still loading) counts as
        falsy, until the last try, whose error is raised."""
        deadline = time.monotonic() + timeout_s
        while True:
            last = time.monotonic() > deadline
            try:
                value = await self.evaluate(script)
            except DevToolsError:
                if last:
                    raise
                value = None
            if value or last:
                return value
            await asyncio.sleep(poll_s)

    async def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        """The viewport as PNG (or the box `clip`: x, y, width, height in CSS pixels)."""
        params: dict[str, Any] = {"format": "png"}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        shot = await self.call("Page.captureScreenshot", **params)
        return base64.b64decode(shot["data"])


class Chromium:
    """A headless Chromium process with a fresh profile and a DevTools port of its own choosing (read from the
    profile's DevToolsActivePort, so no port is guessed); closed on exit."""

    def __init__(self, size: tuple[int, int] = (1600, 1000), executable: str | None = None,
                 start_timeout_s: float = 60.0) -> None:
        self.size = size
        self.executable = executable or chromium_path()
        if not self.executable:
            raise FileNotFoundError("needs Chromium: apt-get install -y chromium")
        self.start_timeout_s = start_timeout_s
        self._profile: tempfile.TemporaryDirectory | None = None
        self._proc: subprocess.Popen | None = None
        self.port: int | None = None

    def __enter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="agentrl-chromium-")
        profile = Path(self._profile.name)
        self._proc = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={profile}", f"--window-size={self.size[0]},{self.size[1]}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.port = self._wait_for_port(profile / "DevToolsActivePort")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_for_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"Chromium exited at start (status {self._proc.returncode})")
            try:
                port = int(port_file.read_text().split()[0])
                httpx.get(f"http://127.0.0.1:{port}/json/version", timeout=2).raise_for_status()
                return port
            except (OSError, ValueError, IndexError, httpx.HTTPError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Chromium's DevTools did not answer in {self.start_timeout_s:.0f} s") from None
                time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=30)
            self._proc = None
        if self._profile is not None:
            self._profile.cleanup()
            self._profile = None

    @asynccontextmanager
    async def page(self) -> AsyncIterator[Page]:
        """The browser's first tab, connected for DevTools commands."""
        targets = httpx.get(f"http://127.0.0.1:{self.port}/json", timeout=10).json()
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        async with websockets.connect(ws_url, max_size=64 << 20) as ws:
            yield Page(ws, self.size)
