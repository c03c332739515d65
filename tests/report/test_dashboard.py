"""``autotune dashboard``: the study, its trials and their user attributes over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from autotune.errors import StorageError
from autotune.report.dashboard import serve
from tests.report import synthetic


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_dashboard_serves_the_study_and_its_user_attrs(synthetic_db: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune", "dashboard", "--storage",
         f"sqlite:///{synthetic_db}", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        studies = None
        while studies is None:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the dashboard did not answer in 40 s"
            try:
                studies = _get(f"{base}/api/studies")["study_summaries"]
            except OSError:
                time.sleep(0.3)
        (study,) = [s for s in studies if s["study_name"] == "synthetic"]
        study_attrs = {a["key"]: a["value"] for a in study["user_attrs"]}
        assert study_attrs["objective"].startswith("model TFLOPS per device")
        assert study_attrs["model"] == "gpt-1.3b"

        detail = _get(f"{base}/api/studies/{study['study_id']}")
        assert detail["objective_names"] == ["model_tflops_per_device"]
        trials = detail["trials"]
        assert len(trials) == len(synthetic.TRIALS)
        by_outcome: dict[str, list[dict[str, str]]] = {}
        for t in trials:
            attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
            by_outcome.setdefault(attrs["outcome"], []).append(attrs)
            assert {p["name"] for p in t["params"]} == {"tp", "pp", "micro_batch",
                                                       "zero_stage", "recompute"}
        assert set(by_outcome) == {"complete", "oom", "infeasible", "error", "timeout"}
        best = detail["best_trials"][0]
        best_attrs = {a["key"]: a["value"] for a in best["user_attrs"]}
        assert best_attrs["layout"] == "tp2-pp1-dp4-mb4-ga2-z1-none"
        assert float(best_attrs["model_tflops_per_device"]) == best["values"][0]
        assert "peak_memory_gib" in best_attrs and "predicted_memory_gib" in best_attrs
        assert "CUDA out of memory" in by_outcome["oom"][0]["reason"]
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    assert proc.stdout is not None
    assert f"at http://127.0.0.1:{port}/dashboard" in proc.stdout.read()


def test_dashboard_never_shows_the_password() -> None:
    lines: list[str] = []
    with pytest.raises(StorageError) as err:
        serve("postgresql+psycopg://tuner:s3cret-pw@127.0.0.1:1/tuning", port=_free_port(),
              log=lines.append)
    assert "s3cret-pw" not in str(err.value) and "tuner:***@" in str(err.value)
    assert not any("s3cret-pw" in line for line in lines)
