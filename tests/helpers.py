"""Shared test helpers: tiny specs and study files, running the CLI, process and job checks."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.trial import RunConfig, TrialSpec

REPO = Path(__file__).resolve().parents[1]

TINY = ModelConfig(n_layer=2, hidden=32, n_head=4, seq_len=16, vocab_size=64, ffn_hidden=128,
                   name="test-tiny")


def tiny_spec(layout: Layout | None = None, **run: Any) -> TrialSpec:
    layout = layout or Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=2)
    return TrialSpec(model=TINY, layout=layout,
                     run=RunConfig(**{"device": "cpu", "warmup_steps": 1, "measure_steps": 2,
                                       "measure_precision": None, **run}))


def write_study(path: Path, *, name: str = "t", devices: int = 2, n_trials: int = 3,
                db: Path | None = None, run_dir: Path | None = None, **sections: Any) -> Path:
    """A tiny CPU study file; ``sections`` override or add top-level sections."""
    study: dict[str, Any] = {
        "name": name,
        "model": {"n_layer": 2, "hidden": 32, "n_head": 4, "seq_len": 16, "vocab_size": 64,
                  "ffn_hidden": 128, "name": "test-tiny"},
        "cluster": {"nodes": 1, "devices_per_node": devices, "device": "cpu"},
        "training": {"global_batch": 8, "dtype": "fp32"},
        "search": {"tp": [1, 2], "pp": [1, 2], "micro_batch": [1, 2, 4], "zero_stage": [0, 1],
                   "recompute": ["none"], "n_trials": n_trials},
        "trial": {"warmup_steps": 1, "measure_steps": 2, "timeout_s": 120, "device": "cpu"},
        "storage": {"url": f"sqlite:///{db or path.parent / 'study.db'}",
                    "heartbeat_interval_s": 1, "grace_period_s": 3},
        "launcher": {"kind": "local", "run_dir": str(run_dir or path.parent / "runs")},
    }
    study.update(sections)
    # The confirmation round (search.confirm, on by default) re-measures the top layouts:
    # tests/runner/test_confirm.py covers it; the others keep their launches (CI's time).
    study["search"] = {"confirm": 0, **study["search"]}
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def run_cli(*args: str, timeout: float = 600, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` in a subprocess (exit codes and output as a user sees them)."""
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})


def is_live(pid: int | str) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie that no one has reaped
    yet (a container's init may never reap one)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
    except OSError:
        return False
    return state != "Z"


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes containing ``text`` (e.g. a trial directory)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and is_live(proc.name):
            out.append(cmd)
    return out


def no_processes_mentioning(text: str, within_s: float = 30.0) -> list[str]:
    """Poll until no live process mentions ``text``, for at most ``within_s`` (a killed
    tree takes a moment to be reaped, longer on a loaded machine); the survivors, if any."""
    deadline = time.monotonic() + within_s
    while (left := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def wait_for_jobs(job_ids: list[str], timeout_s: float) -> None:
    """Poll squeue until none of the jobs is queued or running (sbatch --wait polls slowly)."""

    def squeue(*args: str) -> str:
        return subprocess.run(["squeue", *args], capture_output=True, text=True, timeout=30,
                              check=False).stdout

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not squeue("-h", "-r", "-j", ",".join(job_ids), "-o", "%i %T").strip():
            return
        time.sleep(1.0)
    pytest.fail(f"jobs {job_ids} still queued/running after {timeout_s:.0f} s:\n"
                + squeue("-r"))


def deepest_object(dotted: str) -> tuple[object, list[str]] | None:
    """Where a dotted name (``autotune.search.Strategy.stop``) leads: the object reached from
    its longest importable module prefix through the attributes after it, and the names
    left that this object does not have (empty where the whole name resolves); ``None``
    where no prefix is a module. Shared by the tests that hold docs and docstrings to the
    code."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        while rest and hasattr(found, rest[0]):
            found = getattr(found, rest.pop(0))
        return found, rest
    return None
