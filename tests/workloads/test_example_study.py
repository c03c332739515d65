"""The shipped example end to end: ``examples/deepspeed_gpt/study.yaml``, a real study of a
plain-DeepSpeed program of a user's own on this CPU, through the ``command`` workload, run
from the checkout's root as a user would (only its database and run directory moved into
the test's folder). Every trial's stored step times must be the program's own printed
timings; ``best --emit command`` gives back the winning launch line."""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.slow

STUDY = REPO / "examples" / "deepspeed_gpt" / "study.yaml"
_PRINTED = re.compile(r"^step (\d+)/(\d+) \| time ([0-9.]+) s \| loss", re.M)


def test_the_metrics_helper_copy_is_the_helper() -> None:
    copy = REPO / "examples" / "deepspeed_gpt" / "autotune_metrics.py"
    assert copy.read_text() == (REPO / "autotune" / "metrics_writer.py").read_text()
    assert "import autotune" not in (REPO / "examples" / "deepspeed_gpt" / "train.py").read_text()


def test_example_study_runs_end_to_end(tmp_path: Path, deepspeed_cpu_ops: None) -> None:
    study = yaml.safe_load(STUDY.read_text())
    study["storage"]["url"] = f"sqlite:///{tmp_path / 'example.db'}"
    study["launcher"]["run_dir"] = str(tmp_path / "runs")
    # The confirmation round would re-measure the top layouts (tens of launches here);
    # tests/runner/test_confirm.py covers it, and this test names the single pass's best.
    study["search"]["confirm"] = 0
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    # `python` in the template is the one on PATH: this interpreter's, as in its venv.
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = run_cli("run", str(path), cwd=REPO, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = optuna.load_study(study_name=study["name"],
                               storage=study["storage"]["url"]).get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= 4 and len({t.user_attrs["layout"] for t in complete}) >= 4
    assert {t.user_attrs["launcher"] for t in complete} == {"local"}
    for t in complete:
        trial_dir = Path(t.user_attrs["trial_dir"])
        printed = {int(m[1]): float(m[3])
                   for m in _PRINTED.finditer((trial_dir / "stdout.log").read_text())}
        result = json.loads((trial_dir / "result.json").read_text())
        # Started with the cap (warm-up + 12 timed steps, trial.measure_precision's default
        # cap), stopped once the median was known to 5 %, or run to the cap.
        cap = study["trial"]["warmup_steps"] + 12
        assert {int(m[2]) for m in _PRINTED.finditer((trial_dir / "stdout.log").read_text())
                } == {cap}
        n = result["readback"]["steps"]
        assert sorted(printed)[:n] == list(range(1, n + 1)) and 1 + 6 <= n <= cap
        if max(printed) < cap:  # it never reached its end: autotune stopped it
            assert result["measurement_stop"]["reason"] == "precision"
        assert result["readback"]["source"] == "metrics-file"
        assert result["readback"]["garbage_lines"] == 0
        # The stored step times are the program's own timings (printed to 6 decimals),
        # warm-up dropped, and the score their median.
        stored = result["step_times_s"]
        assert stored == pytest.approx([printed[k] for k in range(2, n + 1)], abs=1e-6)
        assert t.user_attrs["measure_precision"] == pytest.approx(
            result["measure_precision"], abs=1e-5)
        assert t.user_attrs["step_time_s"] == pytest.approx(statistics.median(stored))
        assert t.value == pytest.approx(result["model_tflops_per_device"])
    out = tmp_path / "best"
    out.mkdir()
    best = run_cli("best", str(path), "--emit", "command", "--out", str(out))
    assert best.returncode == 0, best.stderr
    words = shlex.split(best.stdout.splitlines()[-1])
    # The study's workload.env leads the line (it reproduces the run), then the launcher
    # with the layout's ranks, then the argv with the production step count left to fill.
    env_words = [w for w in words[:len(study["workload"].get("env", {}))] if "=" in w]
    assert env_words == [f"{k}={v}" for k, v in study["workload"].get("env", {}).items()]
    launch = words[len(env_words):words.index("--no-python") + 1]
    assert launch == ["torchrun", "--standalone", "--nnodes=1",
                      f"--nproc-per-node={study['cluster']['devices_per_node']}", "--no-python"]
    line = words[words.index("--no-python") + 1:]
    assert line[line.index("--steps") + 1] == "{train_iters}"
    assert "fill in {train_iters}" in best.stdout
    winner = max(complete, key=lambda t: t.value or 0)
    lay = winner.user_attrs["layout_dict"]
    assert line[:2] == ["python", "examples/deepspeed_gpt/train.py"]
    assert line[line.index("--micro-batch-size") + 1] == str(lay["micro_batch"])
    assert line[line.index("--pipeline-stages") + 1] == str(lay["pp"])
    ds = json.loads(Path(line[line.index("--deepspeed-config") + 1]).read_text())
    assert ds["train_batch_size"] == study["training"]["global_batch"]
    assert ds["zero_optimization"]["stage"] == lay["zero_stage"]
