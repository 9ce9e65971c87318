"""calc: arithmetic problems solved through a calculator tool (`calculate`), answered with `submit_answer`.

Standard library only (episodes run in minimal containers).
"""

from .bundle import CalcBundle, CalcEpisode, grade, parse_answer
from .evaluator import CalcError, calculate
from .problems import KINDS, make_problem

__all__ = ["KINDS", "CalcBundle", "CalcEpisode", "CalcError", "calculate", "grade", "make_problem", "parse_answer"]
