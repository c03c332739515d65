"""The ``megatron-deepspeed`` workload end to end. Megatron-DeepSpeed cannot be installed here
(CUDA kernels, apex, a tokenizer, an indexed dataset), so ``programs/megatron_standin.py``
stands in for ``pretrain_gpt.py``: it accepts exactly the arguments a trial is given,
checks them against the trial's ``ds_config.json``, and prints the iteration lines of both
forks from their cited format strings. The trial must be read back from those lines alone
(no metrics file), scored by autotune, and exported by ``best --emit command``."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from autotune.models.flops import model_flops_per_step
from autotune.spec import load_study
from tests.helpers import run_cli, write_study
from tests.workloads.conftest import PROGRAMS

pytestmark = pytest.mark.slow

_DEEPSPEEDAI_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
_ARGONNE_MS = re.compile(r"elapsed_time_per_iteration_ms=([0-9.]+)")


@pytest.mark.parametrize(("fork", "printed", "own"), [
    ("deepspeedai", _DEEPSPEEDAI_MS, {"TFLOPs": 38.61}),
    ("argonne-old", _ARGONNE_MS, {"[LM]TFLOPs": 49.66, "[DS]TFLOPs": 73.32}),
], ids=["deepspeedai", "argonne-old"])
def test_megatron_deepspeed_trial_is_read_from_its_log_lines(
        tmp_path: Path, fork: str, printed: re.Pattern[str], own: dict[str, float]) -> None:
    workload = {"kind": "megatron-deepspeed", "script": str(PROGRAMS / "megatron_standin.py"),
                "python": sys.executable,
                "args": ["--data-path", str(tmp_path / "data_text_document"),
                         "--standin-fork", fork, "--standin-ms", "30"],
                "no_progress_s": 60}
    name = f"mega-{fork}"
    path = write_study(tmp_path / f"{name}.yaml", name=name, devices=1, n_trials=1,
                       search={"tp": [1], "pp": [1], "micro_batch": [2], "zero_stage": [1],
                               "recompute": ["full"], "n_trials": 1},
                       workload=workload)
    proc = run_cli("run", str(path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = load_study(path)
    (trial,) = optuna.load_study(study_name=name, storage=spec.storage.url).get_trials()
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("reason")
    trial_dir = Path(trial.user_attrs["trial_dir"])
    result = json.loads((trial_dir / "result.json").read_text())
    source = "megatron-deepspeedai" if fork == "deepspeedai" else "megatron-argonne"
    assert result["readback"]["source"] == source and not (trial_dir / "metrics.jsonl").exists()
    times = [float(m) / 1000 for m in printed.findall((trial_dir / "stdout.log").read_text())]
    # Started with the cap (warm-up + 12), stopped once the median was known to 5 %, or
    # run to the cap: at least the 6 steady steps of a 95 % interval either way.
    cap = spec.trial.warmup_steps + 12
    assert f"/{cap:8d} |" in (trial_dir / "stdout.log").read_text() or fork != "deepspeedai"
    assert 1 + 6 <= len(times) <= cap and result["step_times_s"] == pytest.approx(times[1:])
    if len(times) < cap:  # it never reached its end: autotune stopped it
        assert result["measurement_stop"]["reason"] == "precision"
    assert result["measure_precision"] is not None
    median = float(np.median(times[1:]))
    flops = model_flops_per_step(spec.model, spec.training.global_batch)
    assert trial.value == pytest.approx(flops / median / 1e12)  # ours, one rank
    assert result["program_tflops_per_device"] == own  # theirs, an extra only
    assert result["peak_memory_bytes"] == int(1234.5 * 2**20)  # Megatron's memory report
    # best --emit command: the user's script and arguments with the layout's flags, the
    # production step count left to fill, not the trial's.
    best = run_cli("best", str(path), "--emit", "command", "--out", str(tmp_path))
    assert best.returncode == 0, best.stderr
    words = shlex.split(best.stdout.splitlines()[-1])
    assert words[:5] == ["torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=1",
                         "--no-python"]  # the study's launcher, the layout's one rank
    line = words[5:]
    assert line[:2] == [sys.executable, str(PROGRAMS / "megatron_standin.py")]
    for flag in ("--micro-batch-size", "--recompute-granularity", "--no-pipeline-parallel",
                 "--deepspeed_config", "--standin-fork"):
        assert flag in line
    assert line[line.index("--train-iters") + 1] == "{train_iters}" and "--save" not in line
