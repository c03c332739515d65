"""benchmarks/plan_cpu_time.py times what ships: the `autotune plan` command in a child
process, four ways. Here on a tiny study, once each: that every way runs and is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import plan_cpu_time as bench
from tests.helpers import write_study


def test_every_way_runs_and_reports_its_cpu_time(tmp_path: Path) -> None:
    study = write_study(tmp_path / "s.yaml", db=tmp_path / "never.db")
    out = tmp_path / "plan.json"
    assert bench.main(["--study", str(study), "--runs", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures) == {"no database", "with database", "--scaling weak (4 sizes)",
                            "--scaling, with database"}
    for way in figures.values():
        assert 0 < way["min_s"] <= way["median_s"] <= way["max_s"] < 60
    assert not (tmp_path / "never.db").exists()  # the copy with a database lies elsewhere


def test_a_baseline_checkout_is_timed_side_by_side(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--baseline DIR`` runs the same commands in another checkout (here this one: the
    ratio is then near 1) and reports its medians and the ratio; a folder that is no
    checkout is refused before anything runs."""
    study = write_study(tmp_path / "s.yaml", db=tmp_path / "never.db")
    out = tmp_path / "plan.json"
    root = Path(bench.__file__).resolve().parent.parent
    assert bench.main(["--study", str(study), "--runs", "1", "--json", str(out),
                       "--baseline", str(root)]) == 0
    for way in json.loads(out.read_text()).values():
        assert way["baseline_median_s"] > 0
        assert way["ratio"] == pytest.approx(way["median_s"] / way["baseline_median_s"])
    assert f"baseline: {root}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        bench.main(["--study", str(study), "--baseline", str(tmp_path)])
    assert refused.value.code == 2
    assert "not a checkout of the project" in capsys.readouterr().err
