"""optuna-dashboard's conventions: a port in use is one line naming --port; a constant axis
gets no importance; the confirmation verdict is a user attribute and the study's note."""

from __future__ import annotations

import socket
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from optuna.trial import TrialState, create_trial

from autotune.errors import UsageError
from autotune.layout import Layout
from autotune.report.dashboard import serve
from autotune.runner.optuna_io import layout_params
from autotune.runner.verdict_note import NOTE_HEADING, VERDICT_ATTR, publish_verdict
from autotune.spec import load_study
from tests.helpers import REPO


def test_a_port_in_use_is_one_line_naming_port(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    optuna.create_study(storage=f"sqlite:///{db}", study_name="d")
    said: list[str] = []
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(UsageError, match=rf"127.0.0.1:{port} .*--port N"):
            serve(f"sqlite:///{db}", port=port, log=said.append)
    assert said == []  # nothing claims to listen


def _importances(dists_of: object) -> dict[str, float]:
    spec = load_study(REPO / "studies" / "cpu_demo.yaml")  # zero_stage: [1] only
    study = optuna.create_study(direction="maximize")
    values = {1: 2.0, 2: 2.6, 4: 3.1}
    for tp in (1, 2):
        for pp in (1, 2):
            for mb in (1, 2, 4):
                lay = Layout(tp=tp, pp=pp, dp=4 // (tp * pp), micro_batch=mb,
                             grad_accum=16 // (mb * (4 // (tp * pp))), zero_stage=1)
                params = layout_params(lay, spec) if dists_of is None else {
                    k: (v, dists_of.get(k, d)) for k, (v, d)  # type: ignore[union-attr]
                    in layout_params(lay, spec).items()}
                study.add_trial(create_trial(
                    state=TrialState.COMPLETE, value=values[mb] / tp - 0.1 * pp,
                    params={k: v for k, (v, _) in params.items()},
                    distributions={k: d for k, (_, d) in params.items()}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_param_importances(study, evaluator=PedAnovaImportanceEvaluator())


def test_a_constant_axis_gets_no_importance_in_the_dashboard() -> None:
    ours = _importances(None)
    assert ours["zero_stage"] == 0.0 and ours["recompute"] == 0.0, ours
    assert ours["micro_batch"] > 0 and ours["tp"] > 0
    # The cause: a constant axis declared over ZeRO 0-3 was credited.
    declared = _importances({"zero_stage": IntDistribution(0, 3)})
    assert declared["zero_stage"] > 0.0, declared


def test_the_verdict_is_an_attribute_and_the_note(tmp_path: Path) -> None:
    from optuna_dashboard import get_note, save_note

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'v.db'}", study_name="v")
    publish_verdict(study, "best tp1-pp2: confirmed")
    assert study.user_attrs[VERDICT_ATTR] == "best tp1-pp2: confirmed"
    assert get_note(study) == f"{NOTE_HEADING}\n\nbest tp1-pp2: confirmed\n"
    publish_verdict(study, "again")  # autotune's own note is updated
    assert "again" in get_note(study)
    save_note(study, "my own notes")
    publish_verdict(study, "third")  # a person's note is left alone
    assert get_note(study) == "my own notes" and study.user_attrs[VERDICT_ATTR] == "third"


def test_the_reports_importance_reads_a_study_with_old_and_new_declarations() -> None:
    from autotune.report.analysis import param_importance

    spec = load_study(REPO / "studies" / "cpu_demo.yaml")
    study = optuna.create_study(direction="maximize")
    for i, (tp, mb) in enumerate([(1, 1), (1, 2), (2, 4), (1, 4), (2, 2), (2, 1)]):
        lay = Layout(tp=tp, pp=1, dp=4 // tp, micro_batch=mb, grad_accum=16 // (mb * 4 // tp),
                     zero_stage=1)
        params = layout_params(lay, spec)
        if i < 3:  # stored before: declared over the world size and ZeRO 0-3
            params = {**params, "pp": (1, IntDistribution(1, 4)),
                      "micro_batch": (mb, IntDistribution(1, 16)),
                      "zero_stage": (1, IntDistribution(0, 3))}
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=float(mb) / tp,
            params={k: v for k, (v, _) in params.items()},
            distributions={k: d for k, (_, d) in params.items()}))
    result = param_importance(study)
    assert result.values is not None, result.note
    assert set(result.values) == {"tp", "micro_batch"}
