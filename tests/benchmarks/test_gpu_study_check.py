"""benchmarks/gpu_study_check.py runs what ships: a real study through ``python -m autotune
run``, read back from its database. Here only its ``--cpu`` smoke run can be checked (no
GPU in CI): the GEMM part and the figures on a device need one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_study_check as bench


@pytest.mark.slow
def test_the_cpu_smoke_run_measures_every_layout_beside_its_prediction(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    code = bench.main(["--cpu", "--preset", "tiny", "--global-batch", "8",
                           "--json", str(out)])
    assert code == 0
    study = json.loads(out.read_text())["study"]
    assert study["exit"] == 0
    rows = study["rows"]
    # the grid: micro-batch 1, 2, 4, 8 x recompute none, full; no early stop, all measured
    assert len(rows) == 8 and {r["outcome"] for r in rows} == {"complete"}
    assert len({r["layout"] for r in rows}) == 8
    for r in rows:
        assert r["tflops"] > 0 and r["predicted_tflops"] > 0
        assert r["peak_gib"] > 0 and r["predicted_gib"] > 0
        assert r["tflops_ratio"] == pytest.approx(r["predicted_tflops"] / r["tflops"])
    assert study["median_tflops_ratio"] > 0 and study["median_memory_ratio"] > 0


def test_without_a_device_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        pytest.skip("a device is here: the benchmark would run")
    assert bench.main(["--skip-study"]) == 2
    assert "no CUDA or XPU device" in capsys.readouterr().err
