"""Helpers of the trainer's multi-process tests: write specs, launch torchrun, read results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

TINY_MODEL: dict[str, Any] = {"n_layer": 4, "hidden": 32, "n_head": 4, "seq_len": 16,
                              "vocab_size": 64}


def spec(tp: int = 1, pp: int = 1, dp: int = 1, *, zero: int = 0, recompute: str = "none",
         global_batch: int = 4, model: dict[str, Any] | None = None, **run: Any) -> dict:
    """A tiny fp32 trial; the global batch is kept fixed whatever the layout."""
    micro = global_batch // (dp * 2)
    return {"model": dict(model or TINY_MODEL),
            "layout": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": micro, "grad_accum": 2,
                       "zero_stage": zero, "recompute": recompute},
            "run": {"warmup_steps": 1, "measure_steps": 2, "measure_precision": None,
                    "dtype": "fp32", "seed": 7,
                    "device": "cpu", **run}}


def launch(tmp: Path, nproc: int, specs: dict[str, dict], *, timeout_s: float = 300,
           torchrun: bool = True, pythonpath: str | None = None,
           env_extra: dict[str, str] | None = None, output: list[str] | None = None,
           preexec_fn: Callable[[], None] | None = None) -> tuple[int, dict[str, Any]]:
    """Run all ``specs`` (name -> spec) in one launch; return (exit code, name -> result).
    ``pythonpath``: folders before the repository (another DeepSpeed, e.g. 0.18.9)."""
    args: list[str] = []
    for name, sp in specs.items():
        (tmp / f"{name}.json").write_text(json.dumps(sp))
        args += ["--spec", str(tmp / f"{name}.json"), "--result", str(tmp / f"{name}.out.json")]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "trainer", *args]
    else:
        cmd = [sys.executable, "-m", "trainer", *args]
    path = f"{pythonpath}:{REPO}" if pythonpath else str(REPO)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(env_extra or {})}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, preexec_fn=preexec_fn)
    if output is not None:  # the launch's own text, for a test that reads a rank's error
        output.append(proc.stdout + proc.stderr)
    results = {}
    for name in specs:
        out = tmp / f"{name}.out.json"
        if out.exists():
            results[name] = json.loads(out.read_text())
    if not results:
        print(proc.stdout[-3000:], proc.stderr[-5000:])
    return proc.returncode, results
