"""The MLflow run page as a user's browser draws it (issue 54): a tiny real GRPO run (two steps, an eval at each,
the greedy-decoded eval at the end), `mlflow ui` on its store, and headless Chromium at 1600x1000 opening the
link the run printed. Its first screen must hold the summary charts (eval grade, greedy-decoded grade, eval
reward, step time, train loss, train reward: each drawn with the values the store holds for the metric it
copies) and none of the plumbing (`async/*`, ...), whose sections follow; the eval table must show its grade,
score and reward columns without scrolling. Screenshots of both go to the test's tmp folder.

Needs Debian's `chromium`: skipped without it, except where AGENTRL_REQUIRE_CHROMIUM=1 (CI: scripts/test.sh
installs it with .ci/setup_chromium.sh), where its absence fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.testing.browser import Chromium, chromium_path
from agentrl.testing.cli import run_agentrl
from agentrl.testing.mlflow_ui import (
    CHART_CARDS,
    CHART_SECTIONS,
    CLOSE_ASSISTANT,
    TABLE_COLUMNS,
    artifact_page,
    mlflow_ui,
)

SCREEN = (1600, 1000)  # a desktop browser's viewport: the "first screen"
DRAW_WAIT_S = 240  # the most a page gets to fetch and draw on a loaded box (polled: a quick one goes on at once)
ARGS = ["+recipe=gridsim_grpo", "trainer.steps=2", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
        "trainer.eval_limit=2", "trainer.eval_every=1", "trainer.checkpoint_every=0", "trainer.max_extra_rows=0",
        "trainer.warm_start.steps=2", "trainer.warm_start.batch_samples=2", "agent.max_response_tokens=24",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
        "model.intermediate_size=64", "model.vocab_size=1024", "logger.trace_train_fraction=0",
        # a name of the length a user's run has (`gridsim_grpo steps=5 seed=0`): one line above the tabs
        "logger.run_name='gridsim_grpo steps=2 seed=0'"]
# The summary section's charts and the metric each copies.
SUMMARY = {"_summary/eval_grade": "eval/grade", "_summary/eval_greedy_grade": "eval_greedy/grade",
           "_summary/eval_reward": "eval/reward", "_summary/time_step_s": "time/step_s",
           "_summary/train_loss": "train/loss", "_summary/train_reward": "train/reward"}


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    if not chromium_path():
        if os.environ.get("AGENTRL_REQUIRE_CHROMIUM") == "1":
            pytest.fail("AGENTRL_REQUIRE_CHROMIUM=1 but no chromium on PATH (.ci/setup_chromium.sh installs it)")
        pytest.skip("needs headless Chromium: apt-get install -y chromium (CI installs it: .ci/setup_chromium.sh)")
    with Chromium(size=SCREEN) as chromium:
        yield chromium


@pytest.fixture(scope="module")
def served(browser: Chromium, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The finished run (`link`: the page its closing block printed; `run`; `client`) and `ui`, MLflow's UI on
    its store."""
    home = tmp_path_factory.mktemp("run_page") / "home"
    done = run_agentrl(ARGS, home)
    [link] = re.findall(r"^\s+then (http\S+)$", done.stdout, flags=re.MULTILINE)
    with mlflow_ui(done.tracking_uri, home / "mlflow_ui.log") as ui:
        yield {"link": link, "run": done.mlflow_run(), "client": done.client(), "ui": ui}


async def look(browser: Chromium, url: str, ready: str, scripts: dict[str, str], png: Path) -> list[dict[str, Any]]:
    """Open `url`, wait until the page script `ready` is true, and take each of `scripts`' answers: as the page
    opened (a first visit shows the MLflow Assistant's side panel), then again with that panel closed. Saves the
    second screen as `png`."""
    seen = []
    async with browser.page() as page:
        await page.open(url)
        for step in ("as opened", "assistant closed"):
            if step == "assistant closed":
                await page.evaluate(CLOSE_ASSISTANT)
                await asyncio.sleep(2)  # the page lays itself out again
            drawn = await page.wait_for(ready, DRAW_WAIT_S)
            seen.append({name: await page.evaluate(script) for name, script in scripts.items()})
            png.write_bytes(await page.screenshot())
            assert drawn, f"{url} never drew what the test waits for ({step}; {png}): {seen[-1]}"
    return seen


def test_the_printed_link_opens_on_reward_grade_loss_and_step_time(browser: Chromium, served: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    run, client = served["run"], served["client"]
    link: str = served["link"]
    assert link.startswith("http://127.0.0.1:5000/") and "/model-metrics?" in link, link
    url = served["ui"] + link.removeprefix("http://127.0.0.1:5000")
    # Ready: every summary chart is there and has drawn its points.
    ready = ("(() => { const cards = " + CHART_CARDS.strip() + "; const keys = " + json.dumps(list(SUMMARY))
             + "; return keys.every(k => cards.some(c => c.key === k && c.points > 0)); })()")
    for seen in asyncio.run(look(browser, url, ready, {"cards": CHART_CARDS, "sections": CHART_SECTIONS},
                                 tmp_path / "run_page_first_screen.png")):
        check_first_screen(seen["cards"], seen["sections"], client, run.info.run_id, tmp_path)


def check_first_screen(cards: list[dict[str, Any]], sections: list[dict[str, Any]], client: Any, run_id: str,
                       folder: Path) -> None:
    first_screen = [c["key"] for c in cards if c["title_shown"] and c["bottom"] <= SCREEN[1]]
    assert sorted(first_screen) == sorted(SUMMARY), (first_screen, folder)
    for card in (c for c in cards if c["key"] in SUMMARY):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, SUMMARY[card["key"]]))
        assert history, card["key"]
        # It plots its own key, one point drawn per logged step (the greedy-decoded eval: its one, at the last
        # step), with the values the metric it copies holds.
        assert card["plotted"] == card["key"] and card["points"] == len(history), (card, history)
        assert sorted((s, v) for s, v in zip(card["steps"], card["values"], strict=True)) == pytest.approx(
            history), card["key"]
    greedy = next(c for c in cards if c["key"] == "_summary/eval_greedy_grade")
    assert greedy["steps"] == [2]

    # The sections: the summary first, the plumbing's after it and below the first screen.
    names = [s["name"] for s in sections]
    assert names[0] == "_summary", names
    assert "async" in names and names.index("async") > 0
    assert all(s["top"] >= max(c["bottom"] for c in cards if c["key"] in SUMMARY) for s in sections[1:])
    assert not [c["key"] for c in cards if c["key"].startswith("async/") and c["top"] < SCREEN[1]]


def test_the_eval_table_shows_its_grade_and_score_without_scrolling(browser: Chromium, served: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    run = served["run"]
    url = artifact_page(served["ui"], run.info.experiment_id, run.info.run_id, "evals/eval-step-2_table.json")
    ready = "(() => { const cols = " + TABLE_COLUMNS.strip() + "; return cols.length > 0; })()"
    for seen in asyncio.run(look(browser, url, ready, {"columns": TABLE_COLUMNS},
                                 tmp_path / "eval_table_first_screen.png")):
        columns = seen["columns"]
        shown = [c["name"] for c in columns if c["shown"]]
        assert {"task_id", "grade", "score", "reward"} <= set(shown), (columns, tmp_path)
        # The long texts come last: a prompt drawn before the numbers would push them off the screen.
        names = [c["name"] for c in columns]
        assert names.index("score") < names.index("prompt") and names.index("grade") < names.index("completion")
