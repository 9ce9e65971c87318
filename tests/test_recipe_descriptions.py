"""Recipe descriptions (each run's MLflow description) state no number that an override could make false."""

from __future__ import annotations

import re

import pytest

from agentrl.config.register import recipe_names
from agentrl.testing.config import compose_config

# Facts of the envs themselves, which no setting changes: GridSim's 24 hourly prices, its 1.0 for the optimal
# schedule and the greedy rule's 0.743 on its eval split; TextArena's 1 / 0.5 / 0 for a win / draw / loss.
FIXED_FACTS = {"24", "1.0", "0.743", "1", "0.5", "0"}
# A number standing alone (not part of a name such as Qwen3 or eval/reward_seat0).
NUMBER = re.compile(r"(?<![\w.])\d[\d,.]*\d|(?<![\w.])\d(?![\w])")


@pytest.mark.parametrize("recipe", recipe_names())
def test_a_description_names_settings_instead_of_their_values(recipe: str):
    description = compose_config(f"+recipe={recipe}").description
    assert set(NUMBER.findall(description)) <= FIXED_FACTS, description


def test_the_number_pattern_finds_what_a_description_used_to_say():
    old = "mean score on the 200 eval days, 2,000 train days, temperature 0.6 (correct 1.2); Qwen3, reward_seat0"
    assert NUMBER.findall(old) == ["200", "2,000", "0.6", "1.2"]
