"""GridSim speed: exact optimum for every stored day, and per-episode start + grade cost.

Run: python benchmarks/micro/bench_gridsim.py
Targets: the 2,200-day optimum under 1 s on one core; episode start+grade in microseconds.
"""

from __future__ import annotations

import time

from agentrl.envs.bundles import load_bundle
from agentrl.envs.bundles.gridsim.battery import Battery, greedy, optimum
from agentrl.envs.bundles.gridsim.tasks import cents_of

EPISODES = 10_000


def _best_of(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    t0 = time.perf_counter()
    bundle = load_bundle("gridsim")
    rows = bundle.rows("train") + bundle.rows("eval")
    load_s = time.perf_counter() - t0
    days = [(cents_of(r), Battery.from_json(r["battery"])) for r in rows]

    solve_s = _best_of(lambda: [optimum(c, b) for c, b in days])
    greedy_s = _best_of(lambda: [greedy(c, b) for c, b in days])
    mismatches = sum(optimum(c, b)[1] != r["optimal_schedule"] for (c, b), r in zip(days, rows, strict=True))

    n_eval = bundle.splits()["eval"]
    schedules = [r["optimal_schedule"] for r in bundle.rows("eval")]

    def episodes() -> None:
        for i in range(EPISODES):
            ep = bundle.episode("eval", i % n_eval)
            ep.first_turn()
            ep.call_tool("submit_schedule", {"schedule": schedules[i % n_eval]})
            ep.scores()

    def start_and_grade() -> None:
        for i in range(EPISODES):
            bundle.episode("eval", i % n_eval).call_tool("submit_schedule", {"schedule": schedules[i % n_eval]})

    def infeasible_then_graded() -> None:
        bad = {"schedule": [-1] * 24}
        for i in range(EPISODES):
            ep = bundle.episode("eval", i % n_eval)
            ep.call_tool("submit_schedule", bad)
            ep.call_tool("submit_schedule", {"schedule": schedules[i % n_eval]})

    ep_s = _best_of(episodes)
    grade_s = _best_of(start_and_grade)
    ep2_s = _best_of(infeasible_then_graded)

    print(f"load_bundle('gridsim') + read 2,200 days: {load_s * 1e3:.1f} ms")
    print(f"exact optimum, all {len(days)} days: {solve_s * 1e3:.1f} ms "
          f"({solve_s / len(days) * 1e6:.1f} us/day; target < 1000 ms, {1.0 / solve_s:.1f}x under)")
    print(f"stored optimal schedules reproduced: {len(days) - mismatches}/{len(days)}")
    print(f"greedy rule, all {len(days)} days: {greedy_s * 1e3:.1f} ms")
    print(f"episode start + first_turn + feasible submission + scores, {EPISODES:,} episodes: {ep_s:.3f} s "
          f"= {ep_s / EPISODES * 1e6:.1f} us/episode")
    print(f"episode start + feasible submission (no prompt rendering), {EPISODES:,}: {grade_s:.3f} s "
          f"= {grade_s / EPISODES * 1e6:.1f} us/episode")
    print(f"episode with one infeasible submission then a graded one, {EPISODES:,}: {ep2_s:.3f} s "
          f"= {ep2_s / EPISODES * 1e6:.1f} us/episode")


if __name__ == "__main__":
    main()
