"""benchmarks/plan_cpu_time.py times what ships: the `autotune plan` command in a child
process, four ways. Here on a tiny study, once each: that every way runs and is read."""

from __future__ import annotations

import json
from pathlib import Path

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
