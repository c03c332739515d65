"""When a study is done: its trial budget is claimed, or a search stop that still holds.

The one statement of the rule. The runner stops on it (:mod:`autotune.runner.study`), and
whoever asks from outside whether running the study again would do anything (``autotune
campaign check``, ``campaign submit``: :mod:`autotune.campaign.jobs`) reads the same
functions on the counts :func:`autotune.report.results.study_status` gives.

>>> study_done(claimed=3, running=0, waiting=0, search_stop=None, n_trials=3,
...            min_improvement=None)
True
>>> study_done(claimed=3, running=0, waiting=1, search_stop=None, n_trials=3,
...            min_improvement=None)  # a retry waits: it is within the budget
False
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.storage import search_stop_threshold

__all__ = ["budget_reached", "within_budget", "search_stop_holds", "study_done"]


def budget_reached(claimed: int, n_trials: int) -> bool:
    """Whether ``claimed`` layouts (measured or being measured) use up ``n_trials``."""
    return claimed >= n_trials


def within_budget(claim_rank: int, n_trials: int) -> bool:
    """Whether the layout claimed ``claim_rank``-th (1-based; the claim order is the budget
    order across workers) is one of the study's ``n_trials``."""
    return claim_rank <= n_trials


def search_stop_holds(search_stop: Mapping[str, Any] | None,
                      min_improvement: float | None) -> bool:
    """Whether a recorded search stop applies at the study's current
    ``search.min_improvement``: it was decided at a threshold no higher (an expected
    improvement below it is below this one too). With the option off it never applies:
    the study then spends its budget."""
    recorded = search_stop_threshold(search_stop)
    return min_improvement is not None and recorded is not None and recorded <= min_improvement


def study_done(*, claimed: int, running: int, waiting: int,
               search_stop: Mapping[str, Any] | None, n_trials: int,
               min_improvement: float | None) -> bool:
    """Whether a runner started now would stop at once.

    Its budget: ``n_trials`` layouts claimed and no retry waiting (a waiting trial re-runs
    an interrupted layout, within the budget). Or a search stop that holds
    (:func:`search_stop_holds`) with nothing running or waiting that could change the
    history the stop was decided on (the decision is a function of the history alone).
    """
    if budget_reached(claimed, n_trials) and waiting == 0:
        return True
    return search_stop_holds(search_stop, min_improvement) and running == 0 and waiting == 0
