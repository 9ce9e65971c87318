"""Screenshots of a run in MLflow's UI, in headless Chromium (Debian's `chromium` package), for docs/.

    python scripts/mlflow_screenshots.py --ui http://127.0.0.1:5000 --experiment 1 --run RUN_ID --out docs/img

Start the UI first (`mlflow ui --backend-store-uri sqlite:///.../outputs/mlflow.db`). Chromium is driven over
its DevTools protocol (no Playwright download): each page is given real time to fetch and draw its charts, the
"MLflow Assistant" side panel is closed, then the viewport is captured as PNG. Writes run.png (the run's
overview, training view) and eval_reward.png (the eval/reward chart).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import websockets

# What Chromium needs on a machine with no screen, no GPU and a closed network (no background fetches).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
# Close the "MLflow Assistant" side panel (its close button's component id), so the page gets the width.
CLOSE_ASSISTANT = """
(() => { const b = document.querySelector('button[data-component-id="mlflow.assistant.chat_panel.close"]');
         if (b) { b.click(); return 'closed'; } return 'no panel'; })()
"""


async def shoot(ws_url: str, url: str, out: Path, wait_s: float, script: str | None = None,
                size: tuple[int, int] = (1600, 1000)) -> None:
    """Open `url`, wait, optionally run `script`, capture the viewport to `out`."""
    async with websockets.connect(ws_url, max_size=64 << 20) as ws:
        seq = 0

        async def call(method: str, **params: object) -> dict:
            nonlocal seq
            seq += 1
            await ws.send(json.dumps({"id": seq, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("id") == seq:
                    return msg.get("result", {})

        await call("Page.enable")
        await call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                   mobile=False)
        await call("Page.navigate", url=url)
        await asyncio.sleep(wait_s)
        if script:
            await call("Runtime.evaluate", expression=script)
            await asyncio.sleep(2)
        shot = await call("Page.captureScreenshot", format="png")
        out.write_bytes(base64.b64decode(shot["data"]))
        print(f"wrote {out} ({url})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ui", default="http://127.0.0.1:5000")
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--wait", type=float, default=20.0, help="seconds each page gets to load its data and charts")
    ap.add_argument("--port", type=int, default=9333)
    ap.add_argument("--height", type=int, default=1000, help="viewport height in pixels (width 1600)")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("needs Chromium: apt-get install -y chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    ui, exp, run = args.ui.rstrip("/"), args.experiment, args.run
    view = "workflowType=machine_learning"
    pages = {
        "run.png": f"{ui}/#/experiments/{exp}/runs/{run}?{view}",
        # MLflow's metric page (Utils.getMetricPageRoute): the sampled and greedy eval reward by step.
        "eval_reward.png": (f"{ui}/#/metric?runs={quote(json.dumps([run]))}&metric={quote(json.dumps('eval/reward'))}"
                            f"&experiments={quote(json.dumps([exp]))}"
                            f"&plot_metric_keys={quote(json.dumps(['eval/reward', 'eval_greedy/reward']))}"
                            "&plot_layout=%7B%7D&x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=true"
                            f"&deselected_curves=%5B%5D&last_linear_y_axis_range=%5B%5D&{view}"),
    }
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={profile}",
                                 f"--window-size=1600,{args.height}", f"--remote-debugging-port={args.port}",
                                 "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    targets = httpx.get(f"http://127.0.0.1:{args.port}/json", timeout=2).json()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            for name, url in pages.items():
                asyncio.run(shoot(ws_url, url, args.out / name, args.wait, CLOSE_ASSISTANT, (1600, args.height)))
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
