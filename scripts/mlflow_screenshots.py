"""Screenshots of a run in MLflow's UI, in headless Chromium (Debian's `chromium` package), for docs/.

    python scripts/mlflow_screenshots.py --ui http://127.0.0.1:5000 --experiment 1 --run RUN_ID --out docs/img
    python scripts/mlflow_screenshots.py ... --no-overview --trace trace.png=TRACE_ID@submit_schedule \
        --artifact eval_table.png=evals/eval-step-8_table.json

Start the UI first (`mlflow ui --backend-store-uri sqlite:///.../outputs/mlflow.db`). Chromium is driven over
its DevTools protocol (no Playwright download; agentrl/testing/browser.py): each page is given real time to fetch
and draw its charts, the "MLflow Assistant" side panel is closed, then the viewport is captured as PNG. Writes
run.png (the run's overview, training view) and metrics.png (its Model metrics tab, where the link a training run
prints opens: the `_summary` charts first, the greedy-decoded grade among them) unless --no-overview; each --trace
NAME=TRACE_ID[@SPAN] writes NAME: the run's Traces tab with that trace opened (SPAN, a span's name, selected in
its tree: its inputs and outputs shown), cropped to the trace's panel; each --artifact NAME=PATH writes NAME: the
run's Artifacts tab with that file open (an MLflow table, `Tracker.log_table`, is drawn as a table: cropped
below its last row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from urllib.parse import urlencode

from agentrl.testing.browser import Chromium
from agentrl.testing.mlflow_ui import (
    CLOSE_ASSISTANT,
    DIALOG_BOX,
    SELECT_SPAN,
    TABLE_BOX,
    artifact_page,
    metrics_page,
    run_page,
)


async def shoot(browser: Chromium, url: str, out: Path, wait_s: float, scripts: list[str],
                clip: str | None = None) -> None:
    """Open `url`, wait, run each of `scripts` (2 s apart), capture the viewport (or the box `clip` returns)."""
    async with browser.page() as page:
        await page.open(url, settle_s=wait_s)
        for script in scripts:
            if (said := await page.evaluate(script)) in ("no span",):
                print(f"warning: {said} ({url})")
            await asyncio.sleep(2)
        box = await page.evaluate(clip) if clip else None
        out.write_bytes(await page.screenshot(box or None))
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
    ap.add_argument("--height", type=int, default=1000, help="viewport height in pixels (width 1600)")
    ap.add_argument("--no-overview", action="store_true", help="skip run.png and metrics.png")
    ap.add_argument("--trace", type=named, action="append", default=[], metavar="NAME=TRACE_ID[@SPAN]")
    ap.add_argument("--artifact", type=named, action="append", default=[], metavar="NAME=PATH")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ui, exp, run = args.ui.rstrip("/"), args.experiment, args.run
    pages: dict[str, tuple[str, list[str], str | None]] = {}  # name -> (url, scripts, clip)
    if not args.no_overview:
        pages["run.png"] = (run_page(ui, exp, run), [CLOSE_ASSISTANT], None)
        pages["metrics.png"] = (metrics_page(ui, exp, run), [CLOSE_ASSISTANT], None)
    for name, spec in args.trace:
        # The run's Traces tab; selectedEvaluationId opens that trace's panel (as the UI's own trace links do).
        trace_id, _, span = spec.partition("@")
        scripts = [CLOSE_ASSISTANT] + ([SELECT_SPAN % json.dumps(span)] if span else [])
        base = run_page(ui, exp, run).partition("?")[0]
        pages[name] = (f"{base}/traces?{urlencode({'selectedEvaluationId': trace_id})}", scripts, DIALOG_BOX)
    for name, path in args.artifact:
        pages[name] = (artifact_page(ui, exp, run, path), [CLOSE_ASSISTANT], TABLE_BOX)
    with Chromium(size=(1600, args.height)) as browser:
        for name, (url, scripts, clip) in pages.items():
            asyncio.run(shoot(browser, url, args.out / name, args.wait, scripts, clip))


if __name__ == "__main__":
    main()
