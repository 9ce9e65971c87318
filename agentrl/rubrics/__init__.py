"""`reward=rubric`: rewards as OpenEnv rubrics (`openenv.core.rubrics`, RFC 004), composed from config.

Nodes (`_target_: agentrl.rubrics.<Name>`): `Score` (an env score), `Format` (a regex on the answer),
`WeightedSum` and `Sequential` (named parts), `Gate`, `Threshold`, and `Judge` (an LLM judge over any
OpenAI-compatible endpoint). `RubricReward` is the group. docs/training.md, "Rewards as rubrics".
"""

from agentrl.rubrics.judge import Judge, JudgeError
from agentrl.rubrics.parts import (
           Format,
           Gate,
           Graded,
           MissingScore,
           Score,
           Sequential,
           Threshold,
           WeightedSum,
)
from agentrl.rubrics.reward import RubricReward

__all__ = ["Format", "Gate", "Graded", "Judge", "JudgeError", "MissingScore", "RubricReward", "Score", "Sequential",
           "Threshold", "WeightedSum"]
