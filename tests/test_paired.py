"""agentrl.paired: the paired per-task difference and pass@k, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from agentrl.paired import mean_se, paired_diff, pass_at_k


def test_mean_se_by_hand() -> None:
    m, se = mean_se([1.0, 2.0, 3.0, 4.0])
    assert m == pytest.approx(2.5)
    assert se == pytest.approx(math.sqrt(5 / 3) / 2)  # sample sd sqrt(5/3), over sqrt(4)
    assert mean_se([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError, match="no values"):
        mean_se([])


def test_paired_diff_by_hand() -> None:
    d = paired_diff([0.5, 1.0, 0.2, 0.9], [0.3, 1.0, 0.4, 0.5])  # diffs 0.2, 0, -0.2, 0.4
    assert d.mean == pytest.approx(0.1)
    # deviations 0.1, -0.1, -0.3, 0.3: sum of squares 0.2, sample variance 0.2/3, se sqrt(0.2/3/4)
    assert d.se == pytest.approx(math.sqrt(0.2 / 3 / 4))
    assert (d.n, d.won, d.lost, d.tied) == (4, 2, 1, 1)
    assert "won 2, lost 1, tied 1" in d.line()
    with pytest.raises(ValueError, match="same tasks"):
        paired_diff([1.0], [1.0, 0.0])


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 1, 0.4), (5, 2, 2, 1 - 3 / 10), (5, 0, 3, 0.0), (5, 5, 1, 1.0), (4, 3, 2, 1.0), (3, 1, 3, 1.0),
])
def test_pass_at_k_unbiased(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_refuses_nonsense() -> None:
    for n, c, k in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(n, c, k)
