"""The benchmark and study scripts import and parse their arguments: they are run by hand, so a refactor that
breaks one (a helper moved between modules) would otherwise surface only in the next proof session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").rglob("*.py")
                 if "if __name__" in p.read_text() and "argparse" in p.read_text())


def test_scripts_found() -> None:
    assert any(p.parent.name == "studies" for p in SCRIPTS), SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_help(script: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=script.parent, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_self_play_eval_cache_keys_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """self_play.py reuses an eval only for the same weights: a folder trained again is evaluated again."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "studies"))
    import self_play

    model = tmp_path / "final_model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"a")
    calls = []

    def play(tag: str):
        calls.append(tag)
        return {"eval/reward": float(len(calls))}, {0: 1.0, 1: 0.5}

    first = self_play.cached(tmp_path, f"{self_play.stamped(str(model))}|sampled", play, "one")
    again = self_play.cached(tmp_path, f"{self_play.stamped(str(model))}|sampled", play, "two")
    assert calls == ["one"] and again == first == ({"eval/reward": 1.0}, {0: 1.0, 1: 0.5})
    st = (model / "model.safetensors").stat()
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # trained again
    redone = self_play.cached(tmp_path, f"{self_play.stamped(str(model))}|sampled", play, "three")
    assert calls == ["one", "three"] and redone[0] == {"eval/reward": 2.0}
    assert not list(tmp_path.glob("*.partial"))


def test_gridsim_cycles_profiles_the_rule_and_the_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """gridsim_cycles.py (RESULTS, proof 1's ceiling): the greedy rule never sells more than one cycle and sits at
    the best single cycle only on some days; the optimum cycles more than once on some 1 h days and is always at
    or above that ceiling."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "studies"))
    import gridsim_cycles

    from agentrl.envs.bundles import load_bundle
    from agentrl.envs.bundles.gridsim.baselines import baseline_scores

    rows = {("eval", i): row for i, row in enumerate(load_bundle("gridsim").rows("eval")[:60])}

    def records(policy: str, schedule_key: str) -> list[dict]:
        return [{"task_id": f"t{i}", "split": "eval", "index": i, "samples": [
            {"score": baseline_scores(row)[policy],
             "answer": "submit_schedule " + json.dumps({"schedule": row[schedule_key]})},
            {"score": 0.0, "answer": "submit_schedule {\"schedule\": [2]}"}]}  # not a schedule
            for (_, i), row in rows.items()]

    rule = gridsim_cycles.profile(records("greedy", "greedy_schedule"), rows)
    best = gridsim_cycles.profile(records("optimum", "optimal_schedule"), rows)
    for prof in (rule, best):
        assert prof["all"]["samples"] == 120 and prof["all"]["unparsed"] == 0.5
    assert rule["all"]["more"] == 0 and 0 < rule["all"]["at_ceiling"] < 0.5
    assert best["1h"]["more"] > 0.2 and best["all"]["at_ceiling"] == 0.5  # every optimum, no unparsed sample
    assert best["all"]["more_score"] == 1.0
    assert rule["all"]["ceiling"] == best["all"]["ceiling"] < 1.0
    with pytest.raises(ValueError, match="no stored GridSim day"):
        gridsim_cycles.profile([{"task_id": "x", "split": "eval", "index": 10**6, "samples": []}], rows)


def test_learned_selector_votes_per_hour_into_a_feasible_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """learned_selector.py (RESULTS, proof 3): the per-hour vote takes each hour's commonest action, first given on
    a tie, idles an hour the storage cannot take, and the selector's target is the first best-graded candidate."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "studies"))
    import learned_selector

    from agentrl.envs.bundles.gridsim.battery import is_feasible

    a, b, c = [1, -1, 0, 0], [1, 0, -1, 0], [0, -1, 1, -1]
    assert learned_selector.per_hour_vote([a, b, c], 1) == [1, -1, 0, 0]
    # hour 1 sells from an empty battery (idle); hour 2's three-way tie goes to the first given, a charge; hour 3's
    # tie is a charge again, but the battery is full (idle)
    vote = learned_selector.per_hour_vote([[0, -1, 1, 1], [0, -1, 0, -1], [1, 0, -1, 0]], 1)
    assert vote == [0, 0, 1, 0] and is_feasible(vote, 1)
    assert learned_selector.best_index([0.5, 0.9, 0.9, 0.1]) == 1
