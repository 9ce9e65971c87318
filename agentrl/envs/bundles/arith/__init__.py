"""arith: verifiable integer-answer math problems (a DAPO-Math stand-in) and the answer verifier.

Standard library only (episodes run in minimal containers).
"""

from agentrl.answers import answers_match, extract_answer, normalize, verify_answer

from .bundle import SUBMIT_ANSWER_TOOL, ArithBundle, ArithEpisode, load_user_rows
from .problems import make_problem

__all__ = ["SUBMIT_ANSWER_TOOL", "ArithBundle", "ArithEpisode", "answers_match", "extract_answer",
           "load_user_rows", "make_problem", "normalize", "verify_answer"]
