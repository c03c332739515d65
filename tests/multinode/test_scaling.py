"""Real weak and strong scaling studies of the tiny GPT over 1, 2 and 4 nodes of the
multi-node cluster (``autotune scaling`` inside a 4-node allocation, as a user runs it),
the weak one stopped by SIGTERM after its first size and resumed; the table, CSV and plot
come out, and the 4-node point predicted from the 1- and 2-node measurements stands
beside the measured one. One trial per size: the point is the machinery, not the search.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.helpers import write_study
from tests.multinode.conftest import MnCluster, salloc

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

CONTRACT = ("nodes", "devices", "best_layout", "model_tflops_per_device", "tokens_per_s",
            "efficiency", "mode", "source")


def _study(tmp_path: Path) -> Path:
    # The file's batch is its cluster's (4 nodes x 2 ranks): weak gives 4, 8, 16.
    return write_study(
        tmp_path / "scale.yaml", name="mnscale", n_trials=1,
        cluster={"nodes": 4, "devices_per_node": 2, "device": "cpu"},
        training={"global_batch": 16, "dtype": "fp32"},
        search={"tp": [2], "pp": [1], "micro_batch": [2], "zero_stage": [0],
                "recompute": ["none"], "n_trials": 1},
        trial={"warmup_steps": 1, "measure_steps": 2, "measure_precision": None,
               "timeout_s": 120, "device": "cpu", "batch_size": 1},
        launcher={"kind": "slurm", "run_dir": str(tmp_path / "runs")})


def _scaling(path: Path, env: dict[str, str], mode: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "scaling", str(path), "--mode", mode,
         "--nodes", "1,2,4", "--csv", str(out / f"{mode}.csv"), "--report",
         str(out / mode)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})


def _stop_after(proc: subprocess.Popen[str], marker: str, *, timeout_s: float) -> str:
    """SIGTERM ``proc`` as soon as its output says ``marker``; its whole output.

    The run's own log line says when a size is done: polling the database it is writing
    raced that run under load (a reader that could not get the file in time saw no
    measurement until the run had finished every size, and the SIGTERM then fell in the
    report's plotting, after the last size)."""
    stdout = proc.stdout
    assert stdout is not None
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in stdout:
            lines.append(line)
            if marker in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert seen.wait(timeout_s), "".join(lines) or "no output"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=timeout_s)
    reader.join(timeout=30)
    return "".join(lines)


def _complete(db: Path, study: str) -> int:
    """Complete measurements of ``study``, read once the runs writing ``db`` have exited."""
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as c:
            return int(c.execute(text("select count(*) from measurements where study_name "
                                      "= :n and outcome = 'complete'"), {"n": study})
                       .scalar_one())
    finally:
        engine.dispose()


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows and set(CONTRACT) <= set(rows[0])
    return rows


def test_weak_and_strong_scaling_over_1_2_4_nodes_resumed_after_sigterm(
        mn_cluster: MnCluster, tmp_path: Path) -> None:
    path, db = _study(tmp_path), tmp_path / "study.db"
    with salloc(mn_cluster, 4) as env:
        first = _scaling(path, env, "weak", tmp_path)
        out = _stop_after(first, "[scaling] nodes 1: best layout", timeout_s=200)
        assert first.returncode == 0, out
        assert _complete(db, "mnscale-n1-gb4") == 1, out
        assert "stopped by SIGTERM" in out, out
        assert _complete(db, "mnscale-n4-gb16") == 0, out
        weak = _scaling(path, env, "weak", tmp_path)
        weak_out, _ = weak.communicate(timeout=400)
        assert weak.returncode == 0, weak_out
        strong = _scaling(path, env, "strong", tmp_path)
        strong_out, _ = strong.communicate(timeout=400)
        assert strong.returncode == 0, strong_out
    print(weak_out[-2500:], strong_out[-2500:], sep="\n")
    # Resumed, not repeated: each size's study has its one measured layout; the 4-node
    # study (the file's own size: batch 16 in both modes) served the strong run too.
    for name in ("n1-gb4", "n2-gb8", "n4-gb16", "n1-gb16", "n2-gb16"):
        assert _complete(db, f"mnscale-{name}") == 1, name
    assert "calibration carried over across world sizes: learned from" in weak_out
    for mode, out in (("weak", weak_out), ("strong", strong_out)):
        rows = _rows(tmp_path / f"{mode}.csv")
        measured = {int(r["nodes"]): r for r in rows if r["source"] == "measured"}
        predicted = {int(r["nodes"]): r for r in rows if r["source"] == "predicted"}
        assert sorted(measured) == sorted(predicted) == [1, 2, 4]
        assert {r["mode"] for r in rows} == {mode}
        assert float(measured[1]["efficiency"]) == 1.0
        assert [int(measured[n]["devices"]) for n in (1, 2, 4)] == [2, 4, 8]
        batches = [int(measured[n]["global_batch"]) for n in (1, 2, 4)]
        assert batches == ([4, 8, 16] if mode == "weak" else [16, 16, 16])
        assert all(float(measured[n]["efficiency"]) > 0 for n in (2, 4))
        assert all(measured[n]["energy_j_per_step"] == "" for n in (1, 2, 4))  # no counter
        # The 4-node point predicted from the 1- and 2-node measurements, beside it.
        assert predicted[4]["calibrated_on"] == "1,2"
        assert float(predicted[4]["model_tflops_per_device_low"]) \
            <= float(predicted[4]["model_tflops_per_device"]) \
            <= float(predicted[4]["model_tflops_per_device_high"])
        assert "nodes 4: predicted" in out and "from sizes 1,2, measured" in out
        assert "energy: not measured (no counter)" in out
        report = tmp_path / mode
        assert (report / "scaling.png").stat().st_size > 1000
        assert "scaling.png" in (report / "scaling.md").read_text()
        error = float(predicted[4]["model_tflops_per_device"]) \
            / float(measured[4]["model_tflops_per_device"]) - 1
        print(f"{mode}: 4 nodes predicted {float(predicted[4]['model_tflops_per_device']):.4g}"
              f" TFLOPS/device from 1+2, measured "
              f"{float(measured[4]['model_tflops_per_device']):.4g} ({error:+.1%}); "
              f"efficiency measured {float(measured[4]['efficiency']):.0%}, predicted "
              f"{float(predicted[4]['efficiency']):.0%}")
