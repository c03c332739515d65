"""``search.objective`` (which measured layout is best) and the report's time-energy
Pareto front."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from autotune.config.study import SearchConfig
from autotune.errors import SpecError
from autotune.objective import select_best, selection_record
from autotune.report.energy import energy_section, pareto_front
from autotune.report.render import Table, Text


def _t(value: float | None, jpt: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(value=value, user_attrs={} if jpt is None
                           else {"joules_per_token": jpt})


def _pick(trials: list[SimpleNamespace], objective: str | None,
          within: float = 0.05) -> SimpleNamespace | None:
    record = None if objective is None else selection_record(objective, within)
    return select_best(trials, record,
                       joules_per_token=lambda t: t.user_attrs.get("joules_per_token"))


def test_each_objective_names_its_best() -> None:
    fast, near, slow, unmeasured = _t(100.0, 3.0), _t(96.0, 2.0), _t(50.0, 1.0), _t(99.0)
    trials = [fast, near, slow, unmeasured, _t(None)]
    assert _pick(trials, None) is fast
    assert _pick(trials, "throughput") is fast
    assert _pick(trials, "energy") is slow
    assert _pick(trials, "throughput-within") is near
    assert _pick(trials, "throughput-within", 0.0) is fast
    # Nothing measured energy: the fastest, never a layout whose "0 J" would win.
    blind = [_t(10.0), _t(12.0), _t(11.0, 0.0)]
    best = _pick(blind, "energy")
    assert best is not None and best.value == 12.0
    assert _pick([], "energy") is None


def test_the_objective_is_validated() -> None:
    assert SearchConfig.from_dict({"objective": "throughput-within",
                                   "throughput_within": 0.1}).throughput_within == 0.1
    with pytest.raises(SpecError, match=r"search\.objective"):
        SearchConfig.from_dict({"objective": "joules"})
    with pytest.raises(SpecError, match=r"search\.throughput_within"):
        SearchConfig.from_dict({"throughput_within": 1.5})


def test_the_pareto_front_of_time_and_energy() -> None:
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 5.0), (2.0, 3.0), (2.5, 4.0), (3.0, 1.0)]) == [0, 1, 3]
    meas = pd.DataFrame({
        "layout_key": ["a", "b", "c", "d"], "outcome": ["complete"] * 3 + ["oom"],
        "step_time_s": [1.0, 2.0, 2.5, 0.5], "model_tflops_per_device": [3.0, 1.5, 1.2, None],
        "energy_j_per_step": [50.0, 40.0, 60.0, None],
        "joules_per_token": [0.5, 0.4, 0.6, None], "model_tflops_per_watt": [1.0, 1.2, 0.8, None],
        "energy_source": ["rapl"] * 3 + [None]})
    section = energy_section(meas)
    table = next(b for b in section.blocks if isinstance(b, Table))
    assert list(table.frame["layout_key"]) == ["a", "b"]
    none = energy_section(meas.assign(joules_per_token=None))
    assert any(isinstance(b, Text) and "energy: not measured (no counter)" in b.text
               for b in none.blocks)


def test_status_and_best_name_the_objective_s_best() -> None:
    import optuna

    from autotune.report.results import selected_trial
    from autotune.storage.keys import StudyAttr
    from autotune.storage.records import best_trial

    study = optuna.create_study(direction="maximize")
    for value, jpt in ((10.0, 2.0), (9.8, 1.5), (5.0, 1.0)):
        study.add_trial(optuna.trial.create_trial(
            value=value, user_attrs={"layout": f"l{value}", "joules_per_token": jpt}))
    assert selected_trial(study).value == 10.0  # a study run before objectives
    study.set_user_attr(StudyAttr.SELECTION, selection_record("throughput-within", 0.05))
    assert selected_trial(study).value == 9.8
    assert best_trial(study).value == 10.0  # the early stop's bar stays the fastest
