"""GridSim v1: one grid battery, one day of ERCOT-style day-ahead prices, graded against the exact optimum.

Standard library only (episodes run in minimal containers). See /work/shared/reference/gridsim.md.
"""

from .battery import Battery, greedy, is_feasible, optimum, profit_units, score, storage_trace
from .bundle import GridSimBundle
from .episode import MAX_SUBMISSIONS, GridSimEpisode, parse_schedule
from .prompts import SUBMIT_SCHEDULE_TOOL, system_prompt, user_prompt
from .tasks import make_task

__all__ = [
    "MAX_SUBMISSIONS", "SUBMIT_SCHEDULE_TOOL", "Battery", "GridSimBundle", "GridSimEpisode", "greedy",
    "is_feasible", "make_task", "optimum", "parse_schedule", "profit_units", "score", "storage_trace",
    "system_prompt", "user_prompt",
]
