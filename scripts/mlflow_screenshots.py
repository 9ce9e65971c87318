"""Screenshots of a run in MLflow's UI, in headless Chromium (Debian's `chromium` package), for docs/.

    python scripts/mlflow_screenshots.py --ui http://127.0.0.1:5000 --experiment 1 --run RUN_ID --out docs/img
    python scripts/mlflow_screenshots.py ... --no-overview --trace trace.png=TRACE_ID@submit_schedule \
        --artifact eval_table.png=evals/eval-step-2_table.json

Start the UI first (`mlflow ui --backend-store-uri sqlite:///.../outputs/mlflow.db`). Chromium is driven over
its DevTools protocol (no Playwright download): each page is given real time to fetch and draw its charts, the
"MLflow Assistant" side panel is closed, then the viewport is captured as PNG. Writes run.png (the run's
overview, training view) and eval_reward.png (the eval/reward chart) unless --no-overview; each --trace
NAME=TRACE_ID[@SPAN] writes NAME: the run's Traces tab with that trace opened (SPAN, a span's name, selected in
its tree: its inputs and outputs shown), cropped to the trace's panel; each --artifact NAME=PATH writes NAME: the
run's Artifacts tab with that file open (an MLflow table, `Tracker.log_table`, is drawn as a table: cropped
below its last row).
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
from urllib.parse import quote, urlencode

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
# Select a span in an opened trace's tree: the first leaf element whose text is the span's name (the tree has
# no stable ids for its rows). Returns whether one was found, so a renamed span fails loudly, not silently.
SELECT_SPAN = """
(() => { const hit = [...document.querySelectorAll('[role=dialog] *')]
           .find(e => e.children.length === 0 && e.textContent.trim() === %s);
         if (hit) { hit.click(); return 'selected'; } return 'no span'; })()
"""
# The opened trace's panel (a dialog over the traces table): its box, to crop the screenshot to it.
DIALOG_BOX = """
(() => { const d = [...document.querySelectorAll('[role=dialog]')].map(e => e.getBoundingClientRect())
           .filter(r => r.width > 300).sort((a, b) => b.width * b.height - a.width * a.height)[0];
         return d ? JSON.stringify({x: d.x, y: d.y, width: d.width, height: d.height}) : ''; })()
"""
# An artifact drawn as a table: the page down to its last row (a shorter viewport would not save the blank below:
# the table then draws fewer rows and pages the rest).
TABLE_BOX = """
(() => { const rows = [...document.querySelectorAll('[role=row]')].map(e => e.getBoundingClientRect().bottom);
         return rows.length ? JSON.stringify({x: 0, y: 0, width: innerWidth, height: Math.max(...rows) + 24}) : '';
       })()
"""


async def shoot(ws_url: str, url: str, out: Path, wait_s: float, scripts: list[str],
                size: tuple[int, int], clip: str | None = None) -> None:
    """Open `url`, wait, run each of `scripts` (2 s apart), capture the viewport (or the box `clip` returns)."""
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

        async def evaluate(script: str) -> str:
            return (await call("Runtime.evaluate", expression=script, returnByValue=True)).get(
                "result", {}).get("value", "")

        await call("Page.enable")
        await call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                   mobile=False)
        await call("Page.navigate", url=url)
        await asyncio.sleep(wait_s)
        for script in scripts:
            if (said := await evaluate(script)) in ("no span",):
                print(f"warning: {said} ({url})")
            await asyncio.sleep(2)
        params: dict = {"format": "png"}
        if clip and (box := await evaluate(clip)):
            params["clip"] = {**json.loads(box), "scale": 1}
        shot = await call("Page.captureScreenshot", **params)
        out.write_bytes(base64.b64decode(shot["data"]))
        print(f"wrote {out} ({url})")


def named(spec: str) -> tuple[str, str]:
    """NAME=VALUE, as --trace and --artifact take them."""
    name, sep, value = spec.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {spec!r}")
    return name, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ui", default="http://127.0.0.1:5000")
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--wait", type=float, default=20.0, help="seconds each page gets to load its data and charts")
    ap.add_argument("--port", type=int, default=9333)
    ap.add_argument("--height", type=int, default=1000, help="viewport height in pixels (width 1600)")
    ap.add_argument("--no-overview", action="store_true", help="skip run.png and eval_reward.png")
    ap.add_argument("--trace", type=named, action="append", default=[], metavar="NAME=TRACE_ID[@SPAN]")
    ap.add_argument("--artifact", type=named, action="append", default=[], metavar="NAME=PATH")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("needs Chromium: apt-get install -y chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    ui, exp, run = args.ui.rstrip("/"), args.experiment, args.run
    view = "workflowType=machine_learning"
    run_page = f"{ui}/#/experiments/{exp}/runs/{run}"
    pages: dict[str, tuple[str, list[str], str | None]] = {}  # name -> (url, scripts, clip)
    if not args.no_overview:
        pages["run.png"] = (f"{run_page}?{view}", [CLOSE_ASSISTANT], None)
        # MLflow's metric page (Utils.getMetricPageRoute): the sampled and greedy eval reward by step.
        pages["eval_reward.png"] = (
            f"{ui}/#/metric?runs={quote(json.dumps([run]))}&metric={quote(json.dumps('eval/reward'))}"
            f"&experiments={quote(json.dumps([exp]))}"
            f"&plot_metric_keys={quote(json.dumps(['eval/reward', 'eval_greedy/reward']))}"
            "&plot_layout=%7B%7D&x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=true"
            f"&deselected_curves=%5B%5D&last_linear_y_axis_range=%5B%5D&{view}", [CLOSE_ASSISTANT], None)
    for name, spec in args.trace:
        # The run's Traces tab; selectedEvaluationId opens that trace's panel (as the UI's own trace links do).
        trace_id, _, span = spec.partition("@")
        scripts = [CLOSE_ASSISTANT] + ([SELECT_SPAN % json.dumps(span)] if span else [])
        pages[name] = (f"{run_page}/traces?{urlencode({'selectedEvaluationId': trace_id})}", scripts, DIALOG_BOX)
    for name, path in args.artifact:
        # The run page's artifact route (runPageWithArtifact) opens the Artifacts tab on that file.
        pages[name] = (f"{run_page}/artifactPath/{quote(path)}?{view}", [CLOSE_ASSISTANT], TABLE_BOX)
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
            for name, (url, scripts, clip) in pages.items():
                asyncio.run(shoot(ws_url, url, args.out / name, args.wait, scripts, (1600, args.height), clip))
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
