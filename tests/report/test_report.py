"""``autotune report``: every section and plot, exports that round-trip, the cross-study view."""

from __future__ import annotations

from pathlib import Path

import optuna
import pandas as pd
import pytest

from autotune.cli import main
from autotune.config.study import StorageConfig
from autotune.report.build import study_report
from autotune.report.frames import MEASUREMENT_COLUMNS, TRIAL_COLUMNS, read_export
from autotune.storage import open_storage
from tests.report import synthetic

SECTIONS = ["Best layouts", "TFLOPS by tensor and pipeline parallelism",
            "Micro-batch size and gradient accumulation (the bubble)",
            "Memory: predicted, measured and device capacity", "Outcomes", "Tuning cost",
            "Parameter importance", "Data"]
PLOTS = ["tp_pp_heatmap", "microbatch", "memory", "outcomes", "cost", "importance"]


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_renders_every_section_and_plot(synthetic_db: Path, tmp_path: Path,
                                               fmt: str, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "report"
    code = main(["report", "synthetic", "--storage", f"sqlite:///{synthetic_db}",
                 "--out", str(out), "--format", fmt])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / f"report.{fmt}")
    assert "[autotune] wrote" in captured.err  # progress lines on the way
    text = (out / f"report.{fmt}").read_text()
    for title in SECTIONS:
        assert title in text, title
    for name in PLOTS:
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"plots/{name}.png" in text
    # The outcomes section names every kind with its reason; the best layout leads.
    for expected in ("out of memory", "infeasible", "failed", "timed out",
                     "CUDA out of memory", "NCCL error", "killed after 900 s",
                     "tp2-pp1-dp4-mb4-ga2-z1-none", "--tensor-model-parallel-size 2"):
        assert expected in text, expected
    assert not list(out.rglob("*.tmp*"))  # atomic writes leave no temporary file


@pytest.fixture(scope="module")
def report_md(synthetic_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _report(synthetic_db, tmp_path_factory.mktemp("report"))


def test_tuning_cost_is_elapsed_times_world_size(report_md: Path) -> None:
    study_report_file = report_md
    meas = read_export(study_report_file.parent / "data" / "measurements.parquet")
    expected = (meas["elapsed_s"] * meas["world_size"]).sum() / 3600
    assert f"{expected:.3g} device-hours" in study_report_file.read_text()
    assert set(meas["outcome"]) == {"complete", "oom", "error", "timeout"}  # infeasible: no run


def _report(db: Path, out: Path, name: str = "synthetic") -> Path:
    storage = open_storage(StorageConfig(url=f"sqlite:///{db}"))
    study = optuna.load_study(study_name=name, storage=storage.optuna)
    return study_report(storage, study, out, fmt="md")


def test_exports_round_trip_through_pandas(report_md: Path) -> None:
    data = report_md.parent / "data"
    trials = read_export(data / "trials.parquet")
    meas = read_export(data / "measurements.parquet")
    assert list(trials.columns) == list(TRIAL_COLUMNS)
    assert list(meas.columns) == list(MEASUREMENT_COLUMNS)
    assert len(trials) == len(synthetic.TRIALS)
    assert len(meas) == sum(1 for t in synthetic.TRIALS if t[4] != "infeasible")
    for frame, name in ((trials, "trials"), (meas, "measurements")):
        pd.testing.assert_frame_equal(read_export(data / f"{name}.csv"), frame)
        # Parquet carries its own dtypes: plain pandas reads back the same frame.
        pd.testing.assert_frame_equal(pd.read_parquet(data / f"{name}.parquet"), frame)
        # CSV needs the dtypes for missing strings and times; the values are the same.
        plain = pd.read_csv(data / f"{name}.csv")
        assert plain.shape == frame.shape
    oom = trials[trials["outcome"] == "oom"].iloc[0]
    assert "CUDA out of memory" in oom["reason"] and pd.isna(oom["value"])
    best = trials.loc[trials["value"].idxmax()]
    assert (best["tp"], best["pp"], best["micro_batch"]) == (2, 1, 4)


def test_importance_explains_why_it_is_missing(tmp_path: Path) -> None:
    one = [t for t in synthetic.TRIALS if t[4] != "complete"] + [synthetic.TRIALS[0]]
    synthetic.build(tmp_path / "one.db", "one", trials=one).close()
    text = _report(tmp_path / "one.db", tmp_path / "out", "one").read_text()
    assert "not computed: 1 complete trial(s); at least 2 are needed" in text
    assert not (tmp_path / "out" / "plots" / "importance.png").exists()


def test_cross_study_view(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "campaign.db"
    for nodes, speed in ((1, 1.1), (2, 1.0), (4, 0.9)):
        synthetic.build(db, f"gpt-{nodes}n", nodes=nodes, speed=speed).close()
    out = tmp_path / "campaign"
    assert main(["report", "--all", "--storage", f"sqlite:///{db}", "--device-type", "h100",
                 "--model", "gpt-1.3b", "--out", str(out), "--format", "html"]) == 0
    text = (out / "report.html").read_text()
    for study in ("gpt-1n", "gpt-2n", "gpt-4n"):
        assert study in text
    assert (out / "plots" / "scaling.png").stat().st_size > 1000
    meas = read_export(out / "data" / "campaign_measurements.csv")
    assert sorted(meas["nodes"].unique()) == [1, 2, 4]
    capsys.readouterr()
    assert main(["report", "--all", "--storage", f"sqlite:///{db}", "--device-type",
                 "a100-80gb", "--out", str(out)]) == 2
    assert "device types ['h100']" in capsys.readouterr().err


def test_report_usage_errors(synthetic_db: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["report", "--storage", f"sqlite:///{synthetic_db}"]) == 2
    assert main(["report", "synthetic", "--storage", f"sqlite:///{synthetic_db}",
                 "--model", "x"]) == 2
    assert main(["report", "nope", "--storage", f"sqlite:///{synthetic_db}"]) == 2
    assert "studies there: synthetic" in capsys.readouterr().err
