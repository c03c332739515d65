"""The report's plots hold every measured trial: complete ones filled, stopped ones (stored
COMPLETE before, PRUNED with intermediate values now) hollow at their measured value, a
retried layout with its measurement; the memory axes are zoomed to the data.

Points are counted on the drawn figure (``_save`` captured), not in the frame fed to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from autotune.report import analysis as an
from autotune.report import plots
from autotune.report.frames import trials_frame


def _trial(number: int, mb: int, pp: int, outcome: str, value: float | None,
           state: TrialState, steps: dict[int, float] | None = None,
           peak: float | None = 0.5) -> Any:
    ga = 16 // (mb * (4 // pp))
    lay = {"tp": 1, "pp": pp, "dp": 4 // pp, "micro_batch": mb, "grad_accum": ga,
           "zero_stage": 1, "recompute": "none"}
    attrs: dict[str, Any] = {"outcome": outcome, "layout_dict": lay,
                             "predicted_memory_gib": 0.4 + 0.05 * mb}
    if peak is not None:
        attrs["peak_memory_gib"] = peak + 0.02 * mb
    dist = IntDistribution(1, 8)
    return create_trial(state=state, value=value, intermediate_values=steps or {},
                        params={"tp": 1, "pp": pp, "micro_batch": mb},
                        distributions={"tp": dist, "pp": dist, "micro_batch": dist},
                        user_attrs=attrs)


@pytest.fixture
def frame() -> pd.DataFrame:
    study = optuna.create_study(direction="maximize")
    for t in [
        _trial(0, 1, 1, "complete", 2.0, TrialState.COMPLETE),
        _trial(1, 2, 1, "complete", 2.4, TrialState.COMPLETE),
        _trial(2, 4, 2, "complete", 2.2, TrialState.COMPLETE),
        _trial(3, 1, 2, "stopped", 1.1, TrialState.COMPLETE),          # stored before
        _trial(4, 2, 2, "stopped", None, TrialState.PRUNED, {0: 1.0, 1: 1.2, 2: 1.3}),
        _trial(5, 4, 1, "killed", None, TrialState.FAIL, peak=None),  # then retried:
        _trial(6, 4, 1, "complete", 2.6, TrialState.COMPLETE),
    ]:
        study.add_trial(t)
    return trials_frame(study)


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    figures: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    return figures


def _scatter(ax: Any) -> tuple[int, int]:
    """(filled, hollow) points of an axes' scatter collections."""
    filled = hollow = 0
    for coll in ax.collections:
        n = len(coll.get_offsets())
        faces = coll.get_facecolors()
        if len(faces) == 0 or np.allclose(faces[:, 3], 0):
            hollow += n
        else:
            filled += n
    return filled, hollow


def test_stopped_trials_have_their_measured_value(frame: pd.DataFrame) -> None:
    measured = frame.set_index("number")["measured_value"]
    assert measured[3] == 1.1 and measured[4] == 1.2 and np.isnan(measured[5])


def test_microbatch_and_bubble_plots_show_every_measured_trial(
        frame: pd.DataFrame, drawn: list[Any]) -> None:
    plots.microbatch_effect(an.microbatch_frame(frame), Path("x.png"))
    left, right = drawn[0].axes[:2]
    assert _scatter(left) == (4, 2)  # 4 complete (the retry's included), 2 stopped
    assert _scatter(right) == (4, 2)
    lo, hi = left.get_ylim()
    assert lo > 0.5 and hi < 3.0  # zoomed to 1.1 .. 2.6, not from zero


def test_heatmap_prints_values_where_they_exist(frame: pd.DataFrame,
                                                drawn: list[Any]) -> None:
    best, what = an.tp_pp_grid(frame)
    plots.tp_pp_heatmap(best, what, Path("x.png"))
    texts = [t.get_text() for t in drawn[0].axes[0].texts]
    assert "2.6" in texts and "2.2" in texts  # tp1-pp1: the retry's value, not "killed"
    assert not any(t in ("stopped", "killed") for t in texts), texts
    title = drawn[0].axes[0].get_title()
    assert "colours span 2.2 to 2.6 (15% of the best)" in title, title


def test_heatmap_marks_a_cell_measured_only_by_a_stopped_trial(drawn: list[Any]) -> None:
    study = optuna.create_study(direction="maximize")
    study.add_trial(_trial(0, 1, 1, "complete", 2.0, TrialState.COMPLETE))
    study.add_trial(_trial(1, 2, 2, "stopped", None, TrialState.PRUNED, {0: 1.0}))
    best, what = an.tp_pp_grid(trials_frame(study))
    plots.tp_pp_heatmap(best, what, Path("x.png"))
    assert "1\n(stopped)" in [t.get_text() for t in drawn[0].axes[0].texts]


def test_memory_plot_zooms_to_the_data_and_marks_a_far_capacity(
        frame: pd.DataFrame, drawn: list[Any]) -> None:
    has = frame[frame["predicted_memory_gib"].notna() & frame["peak_memory_gib"].notna()]
    plots.memory_vs_capacity(has, 8.0, Path("x.png"))
    ax = drawn[0].axes[0]
    assert _scatter(ax) == (4, 2)
    assert ax.get_xlim()[1] < 1.0 and ax.get_ylim()[1] < 1.0  # not out to 8 GiB
    assert any("device memory 8 GiB" in t.get_text() and "off scale" in t.get_text()
               for t in ax.texts)
    drawn.clear()
    plots.memory_vs_capacity(has, 0.7, Path("x.png"))  # near the data: the line stays
    ax = drawn[0].axes[0]
    assert ax.get_ylim()[1] >= 0.7
    assert "device memory 0.7 GiB" in ax.get_legend_handles_labels()[1]


def test_the_closing_table_shows_a_pruned_stopped_trials_value() -> None:
    from autotune.runner.progress import trials_table

    study = optuna.create_study(direction="maximize")
    study.add_trial(_trial(0, 1, 1, "complete", 2.0, TrialState.COMPLETE))
    pruned = _trial(1, 2, 1, "stopped", None, TrialState.PRUNED, {0: 1.0, 1: 1.4})
    pruned.user_attrs["layout"] = "tp1-pp1-dp4-mb2-ga2-z1-none"
    study.add_trial(pruned)
    table = trials_table(study.get_trials())
    assert table is not None
    row = next(line for line in table.splitlines() if "stopped" in line)
    assert " 1.2 " in f" {row} ", table
