"""An empty layout space names its reason; ``plan`` and ``run`` exit 2 on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config.study import SearchConfig
from autotune.errors import UsageError
from autotune.feasibility import Reason
from autotune.layout import Layout
from autotune.planning.empty import empty_space_reasons, structural_reasons
from autotune.planning.plan import plan_study, render_plan
from autotune.spec import load_study
from tests.helpers import run_cli, write_study


def _search(**axes: object) -> SearchConfig:
    base: dict[str, object] = {"tp": (1,), "pp": (1,), "micro_batch": (1,)}
    return SearchConfig(**{**base, **axes})  # type: ignore[arg-type]


def test_tp_that_divides_no_world_size() -> None:
    assert structural_reasons(_search(tp=(2,)), 3, 16) == [
        "tp=2 does not divide the world size 3 (allowed tp: 1, 3)"]


def test_pp_that_divides_no_remaining_devices() -> None:
    [reason] = structural_reasons(_search(tp=(1, 2), pp=(3,)), 4, 16)
    assert reason.startswith("pp=3 does not divide the devices left by tp")
    assert "4 with tp=1" in reason and "allowed pp: 1, 2, 4" in reason


def test_micro_batch_above_or_not_dividing_the_global_batch() -> None:
    assert structural_reasons(_search(micro_batch=(32,)), 1, 16) == [
        "micro_batch 32 > global_batch 16"]
    [reason] = structural_reasons(_search(micro_batch=(4,)), 2, 6)
    assert "micro_batch 4" in reason and "allowed micro_batch: 1, 3" in reason


def test_a_working_space_has_no_structural_reason() -> None:
    assert structural_reasons(_search(tp=(1, 2), pp=(1, 2), micro_batch=(1, 2)), 4, 16) == []


def test_all_excluded_names_the_counts_and_an_example() -> None:
    lay = Layout(tp=1, pp=1, dp=1, micro_batch=1, grad_accum=16)
    excluded = [(lay, [Reason("memory", "needs 9 GiB of 8 GiB")])] * 2
    reasons = empty_space_reasons(_search(), 1, 16, excluded)
    assert reasons[0] == "all 2 layouts are excluded"
    assert reasons[1].startswith("2 excluded by memory, e.g. tp1-pp1-dp1-mb1-ga16")


def _study(tmp_path: Path, devices: int, **search: object) -> Path:
    axes = {"tp": [1, 2], "pp": [1], "micro_batch": [1, 2], "zero_stage": [1],
            "recompute": ["none"], "n_trials": 2, **search}
    return write_study(tmp_path / "s.yaml", devices=devices, search=axes)


def test_plan_prints_the_reason_and_exits_2(tmp_path: Path) -> None:
    study = _study(tmp_path, 3, tp=[2])
    result = plan_study(load_study(study))
    assert result.n_feasible == 0
    assert "tp=2 does not divide the world size 3" in render_plan(result)
    proc = run_cli("plan", str(study), "--no-learn", timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "tp=2 does not divide the world size 3 (allowed tp: 1, 3)" in proc.stdout
    assert "tp=2 does not divide the world size 3 (allowed tp: 1, 3)" in proc.stderr


def test_run_names_the_reason_and_launches_nothing(tmp_path: Path) -> None:
    from autotune.launchers import make_launchers
    from autotune.runner.study import run_study
    from autotune.storage import open_storage

    spec = load_study(_study(tmp_path, 2, micro_batch=[32]))
    launchers = make_launchers(spec.launcher, spec.model, spec.cluster, spec.training,
                               source=spec.source, workload=spec.workload)
    with pytest.raises(UsageError, match=r"micro_batch 32 > global_batch 8"):
        run_study(spec, open_storage(spec.storage), launchers, n_trials=2)
    assert not (tmp_path / "runs").exists()


def test_run_on_a_space_of_no_layout_creates_no_database(tmp_path: Path) -> None:
    study = _study(tmp_path, 3, tp=[2])
    proc = run_cli("run", str(study), timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "tp=2 does not divide the world size 3 (allowed tp: 1, 3)" in proc.stderr
    assert not (tmp_path / "study.db").exists() and not (tmp_path / "runs").exists()
