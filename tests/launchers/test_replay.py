"""The replay launcher: the launcher contract, the table's value for a known layout, a
clear refusal otherwise."""

from __future__ import annotations

import pandas as pd
import pytest

from autotune.config.cluster import ClusterConfig
from autotune.errors import LaunchError, SpecError
from autotune.landscape import LandscapeGroup, Measurement
from autotune.launchers.base import Launcher
from autotune.launchers.replay import ReplayLauncher, group_from_frame
from autotune.layout import Layout
from autotune.trial import RunConfig, TrialPaths, TrialSpec
from autotune.trial.classify import classify
from tests.helpers import TINY, tiny_spec
from tests.launchers.contract import LauncherContract
from tests.search.conftest import synthetic_group

OOM_LAYOUT = Layout(tp=2, pp=1, dp=1, micro_batch=4, grad_accum=1)


class TestReplayLauncher(LauncherContract):
    """The contract on a two-row table of the contract's own spec: the spec's layout ran
    (``ok``), :data:`OOM_LAYOUT` ran out of memory. It starts no processes, so the timeout
    and cancel checks do not apply."""

    supports_processes = False

    @pytest.fixture
    def launcher(self) -> ReplayLauncher:
        ok = tiny_spec().layout
        rows = (Measurement(ok, "ok", 0.5, 0.2), Measurement(OOM_LAYOUT, "oom", None, None))
        return ReplayLauncher(LandscapeGroup("contract", TINY, ClusterConfig(devices_per_node=2),
                                             ok.global_batch, "fp32", rows))

    def failing_spec(self) -> TrialSpec:
        return tiny_spec(OOM_LAYOUT)


@pytest.fixture
def group():
    return synthetic_group()


def test_is_a_launcher_and_returns_the_table_value(group, tmp_path):
    launcher = ReplayLauncher(group)
    assert isinstance(launcher, Launcher)
    m = group.best()
    spec = TrialSpec(group.model, m.layout, RunConfig())
    report = launcher.run(spec, TrialPaths(tmp_path / "t"), timeout_s=5)
    assert report.result.status == "ok"
    assert report.result.model_tflops_per_device == m.model_tflops_per_device
    assert report.result.step_time_s > 0
    outcome = classify(report)
    assert outcome.kind == "complete" and outcome.value == m.model_tflops_per_device


def test_a_replayed_trial_is_charged_the_tables_time_not_the_reading_s(group, tmp_path):
    # What the budgets weigh (the confirmation round's, the tuning cost) is what the table's
    # trial took: build_s, then the warm-up and timed steps at its (drifted) step time. The
    # few milliseconds of reading a row varied with the machine's load, and a CI run's
    # confirmation round planned 8 rounds where the same study planned 4 on a quiet one.
    import json

    from autotune.config._drift import DriftRule

    m = group.best()
    run = RunConfig(warmup_steps=2, measure_steps=5, measure_precision=None)
    slow = ReplayLauncher(group, (DriftRule("*", (1.5,)),), build_s=30.0)
    paths = TrialPaths(tmp_path / "t")
    report = slow.run(TrialSpec(group.model, m.layout, run), paths, timeout_s=5)
    step = report.result.step_time_s
    assert step == pytest.approx(1.5 * ReplayLauncher(group).result_for(m.layout).step_time_s)
    assert report.result.timings_s["build"] == 30.0
    assert report.elapsed_s == pytest.approx(30.0 + 7 * step)
    assert report.elapsed_s == report.result.elapsed_s
    assert json.loads(paths.report.read_text())["elapsed_s"] == report.elapsed_s
    oom = next(x for x in synthetic_group(oom_mb=4).measurements if x.status == "oom")
    failed = ReplayLauncher(synthetic_group(oom_mb=4), build_s=30.0).run(
        TrialSpec(group.model, oom.layout, run), TrialPaths(tmp_path / "o"), timeout_s=5)
    assert failed.elapsed_s == 30.0  # a failure in its first step costs the build alone


def test_oom_rows_replay_as_oom(tmp_path):
    group = synthetic_group(oom_mb=4)
    oom = next(m for m in group.measurements if m.status == "oom")
    report = ReplayLauncher(group).run(TrialSpec(group.model, oom.layout),
                                       TrialPaths(tmp_path / "t"), timeout_s=5)
    assert report.result.status == "oom" and classify(report).kind == "oom"


def test_unknown_layout_is_refused(group, tmp_path):
    unknown = Layout(tp=8, pp=1, dp=1, micro_batch=1, grad_accum=16)
    with pytest.raises(LaunchError, match="not in landscape 'synthetic'"):
        ReplayLauncher(group).result_for(unknown)
    with pytest.raises(LaunchError, match="tp8-pp1-dp1-mb1-ga16"):
        ReplayLauncher(group).run(TrialSpec(group.model, unknown), TrialPaths(tmp_path / "t"),
                                  timeout_s=5)


def test_group_from_measurements_frame(group):
    rows = [{**m.layout.to_dict(), "status": m.status,
             "model_tflops_per_device": m.model_tflops_per_device}
            for m in group.measurements]
    rows.append({**rows[0], "status": None, "outcome": "infeasible"})  # never ran: dropped
    rows.append({**rows[1], "model_tflops_per_device": rows[1]["model_tflops_per_device"] + 2})
    df = pd.DataFrame(rows)
    rebuilt = group_from_frame(df, group.model, group.cluster, 16, "fp32")
    assert len(rebuilt.measurements) == len(group.measurements)
    assert rebuilt.best().layout == group.best().layout
    second = rebuilt.lookup(group.measurements[1].layout)
    assert second.model_tflops_per_device == pytest.approx(
        group.measurements[1].model_tflops_per_device + 1)  # merged: the mean
    with pytest.raises(SpecError, match="missing column"):
        group_from_frame(df.drop(columns=["tp"]), group.model, group.cluster, 16, "fp32")


def test_a_spec_of_another_model_is_refused_naming_the_dimension(group, tmp_path):
    from dataclasses import replace

    other = replace(group.model, n_layer=group.model.n_layer + 1)
    with pytest.raises(LaunchError, match=rf"model n_layer {group.model.n_layer} \(study: "):
        ReplayLauncher(group).run(TrialSpec(other, group.best().layout),
                                  TrialPaths(tmp_path / "t"), timeout_s=5)


def test_a_replay_checks_its_rows_as_a_real_study_by_default() -> None:
    from autotune.config.launcher import ReplayOptions

    assert ReplayOptions.from_dict({"landscape": "t.csv"}).study_check is True
    assert ReplayOptions.from_dict({"landscape": "t.csv", "study_check": False}
                                   ).study_check is False
