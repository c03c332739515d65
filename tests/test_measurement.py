"""The order-statistic bounds of the median step time hold whatever the distribution of a
step (autotune/trial/measurement.py): checked by simulation on skewed step times."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.trial.measurement import (
    hopeless,
    median_interval,
    median_lower_bound,
    relative_precision,
)


@pytest.mark.parametrize("n", [6, 9, 12, 20])
def test_the_interval_covers_the_median_at_least_as_often_as_stated(n: int) -> None:
    rng = np.random.default_rng(n)
    true_median = float(np.exp(0.0))  # lognormal(0, 0.5): skewed, median exp(0) = 1
    reps, covered = 4000, 0
    for _ in range(reps):
        xs = rng.lognormal(0.0, 0.5, n)
        interval = median_interval(list(xs), 0.95)
        assert interval is not None
        covered += interval[0] <= true_median <= interval[1]
    assert covered / reps >= 0.95 - 3 * np.sqrt(0.05 * 0.95 / reps)


def test_the_lower_bound_exceeds_the_median_at_most_as_often_as_stated() -> None:
    rng = np.random.default_rng(0)
    reps = 4000
    above = sum(median_lower_bound(list(rng.lognormal(0.0, 0.5, 7)), 0.95) > 1.0
                for _ in range(reps))
    assert above / reps <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)


def test_too_few_steps_say_nothing() -> None:
    assert median_interval([1.0] * 5, 0.95) is None
    assert relative_precision([1.0] * 5, 0.95) is None
    assert median_lower_bound([1.0] * 4, 0.95) is None
    assert not hopeless([9.0] * 4, max_step_time_s=1.0, confidence=0.95)
    assert hopeless([9.0] * 5, max_step_time_s=1.0, confidence=0.95)
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0] * 10, 1.5)


def test_precision_narrows_with_more_steps() -> None:
    rng = np.random.default_rng(1)
    xs = list(rng.lognormal(0.0, 0.1, 200))
    few, many = relative_precision(xs[:8], 0.95), relative_precision(xs, 0.95)
    assert few is not None and many is not None and many < few < 1
