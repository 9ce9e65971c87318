"""MLflow's own UI, as a user opens it: `mlflow ui` started on a store, its pages' addresses, and the page scripts
that read what a page shows (run in headless Chromium, `agentrl/testing/browser.py`). Shared by the run-page test
(`tests/tracking/test_run_page_first_screen.py`) and `scripts/mlflow_screenshots.py`. The selectors are those of
MLflow 3.17.2's UI (constraints.txt pins it); a page script that finds nothing returns an empty answer, so a
changed UI fails the test loudly rather than passing it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from agentrl.testing.ports import free_port
from agentrl.testing.processes import wait_healthy
from agentrl.tracking.mlflow_tracker import METRICS_TAB, UI_TRAINING_VIEW


@contextmanager
def mlflow_ui(tracking_uri: str, log: Path, timeout_s: float = 180.0) -> Iterator[str]:
    """`mlflow ui --backend-store-uri tracking_uri` on a free port (its output in `log`); yields its address once
    `/health` answers, and stops it (its whole process group: uvicorn's children) after. MLflow's job runner (a
    pool of huey workers for GenAI jobs no page here needs) is left off."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri,
                                 "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, timeout=timeout_s, log=log, poll=0.5)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def run_page(ui: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """A run's page in the training view; `tab`: `METRICS_TAB`, `traces`, ... (empty: the overview)."""
    tab_path = f"/{tab}" if tab else ""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{tab_path}?{UI_TRAINING_VIEW}"


def metrics_page(ui: str, experiment_id: str, run_id: str) -> str:
    """The run's metric charts (the tab the link a training run prints opens)."""
    return run_page(ui, experiment_id, run_id, METRICS_TAB)


def artifact_page(ui: str, experiment_id: str, run_id: str, path: str) -> str:
    """The run's Artifacts tab with the artifact `path` open (the UI's runPageWithArtifact route)."""
    page = run_page(ui, experiment_id, run_id)
    base, _, query = page.partition("?")
    return f"{base}/artifactPath/{quote(path)}?{query}"


# Close the "MLflow Assistant" side panel (its close button's component id), so the page gets the width.
CLOSE_ASSISTANT = """
(() => { const b = document.querySelector('button[data-component-id="mlflow.assistant.chat_panel.close"]');
         if (b) { b.click(); return 'closed'; } return 'no panel'; })()
"""
# Whether the element `e` is drawn where it sits: the topmost element at its box's centre is it or inside it
# (so a box clipped by a scrolled container, or covered by another, is not shown).
_SHOWN = """
const shown = e => { const b = e.getBoundingClientRect();
  if (b.width === 0 || b.top < 0 || b.left < 0 || b.bottom > innerHeight || b.right > innerWidth) return false;
  const at = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
  return !!at && (e === at || e.contains(at)); };
"""
# The metric charts of a run's Model metrics tab, in page order: each one's metric key (its title's tooltip),
# its card's box, whether its title is drawn on the screen, the points its line draws (marks in its SVG)
# and the metric, steps and values it plots (Plotly's data on the plot's element).
CHART_CARDS = "(() => {" + _SHOWN + """
  return [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')].map(card => {
    const title = card.querySelector('h4[title]'), b = card.getBoundingClientRect();
    // Plotly's traces: the run's line with its markers first, a smoothed copy of it after.
    const plot = card.querySelector('.js-plotly-plot'), line = ((plot && plot.data) || [])[0] || {};
    return {key: title ? title.getAttribute('title') : '', top: b.top, bottom: b.bottom, left: b.left,
            right: b.right, title_shown: !!title && shown(title),
            points: [...card.querySelectorAll('.scatterlayer .trace, .barlayer .trace')].slice(0, 1)
                      .reduce((n, t) => n + t.querySelectorAll('.point').length, 0),
            plotted: line.metricKey || '', steps: [...(line.x || [])], values: [...(line.y || [])]};
  }); })()
"""
# The chart sections of the Model metrics tab, in page order: each one's name and top.
CHART_SECTIONS = """
(() => [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-section-header"]')].map(h => {
   const name = [...h.querySelectorAll('*')].find(e => e.children.length === 0 && e.textContent.trim());
   return {name: name ? name.textContent.trim() : '', top: h.getBoundingClientRect().top}; }))()
"""
# The column headers of an artifact drawn as a table (an MLflow table, `Tracker.log_table`): each one's text and
# whether it is drawn on the screen (not scrolled out of the table's box).
TABLE_COLUMNS = "(() => {" + _SHOWN + """
  return [...document.querySelectorAll('[role=columnheader]')].map(
    h => ({name: h.textContent.trim(), shown: shown(h)})); })()
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
         return d ? {x: d.x, y: d.y, width: d.width, height: d.height} : null; })()
"""
# An artifact drawn as a table: the page down to its last row (a shorter viewport would not save the blank below:
# the table then draws fewer rows and pages the rest).
TABLE_BOX = """
(() => { const rows = [...document.querySelectorAll('[role=row]')].map(e => e.getBoundingClientRect().bottom);
         return rows.length ? {x: 0, y: 0, width: innerWidth, height: Math.max(...rows) + 24} : null; })()
"""
