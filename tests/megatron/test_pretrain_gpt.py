"""Real Megatron-DeepSpeed ``pretrain_gpt.py`` trials through ``autotune run`` on CPU.

The deepspeedai fork (``AUTOTUNE_MEGATRON_DIR``: see ``conftest.py``), 2 ranks over gloo, a
tiny GPT on a tiny indexed data set written here (:mod:`tests.megatron.indexed_data`,
``NullTokenizer``). Each row of :data:`LAYOUTS` is one study of one layout: it must be
measured ``complete``, read back from Megatron's own log lines (step times equal to the
printed ones at their printed precision: ``elapsed time per iteration (ms): {:.1f}``,
``megatron/training.py`` ``training_log``), and stored as ``megatron-deepspeed``.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import create_engine, text

from tests.helpers import REPO, run_cli, write_study
from tests.megatron.conftest import MegatronEnv
from tests.megatron.indexed_data import write_indexed_dataset

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

LAYOUTS: list[dict[str, Any]] = [
    # One study each. Together they cover tp = 2, pp = 2, dp = 2 and Megatron's own
    # recompute (--recompute-granularity full and selective); --sequence-parallel has its
    # own test below.
    {"id": "tp2-full", "tp": 2, "pp": 1, "micro_batch": 1, "zero_stage": 0,
     "recompute": "full"},
    {"id": "pp2", "tp": 1, "pp": 2, "micro_batch": 1, "zero_stage": 0, "recompute": "none"},
    {"id": "dp2-selective", "tp": 1, "pp": 1, "micro_batch": 2, "zero_stage": 0,
     "recompute": "selective"},
    {"id": "dp2-ga2", "tp": 1, "pp": 1, "micro_batch": 1, "zero_stage": 0,
     "recompute": "none"},
]
"""Four rows (with the OOM's, the misspelled flag's and the SP trials, 8 real trials): each
costs 25-45 s on an idle 2-core machine, 90-135 s on a loaded one; plain tp2, tp2-mb2 and
pp2-mb2 rows ran and passed too (2026-12-01) and were left out for CI's time. Full
recompute is measured at pp = 1: with a pipeline, Megatron hands it to DeepSpeed's
activation checkpointing (``GPTModelPipe``'s ``activation_checkpoint_interval``), which
fails on a CPU (``get_accelerator().Stream`` is None; docs/own-command.md)."""
MODEL = {"n_layer": 2, "hidden": 64, "n_head": 4, "seq_len": 64, "vocab_size": 256,
         "ffn_hidden": 256, "name": "tiny-megatron"}
# What Megatron needs on a CPU (shared/megatron-deepspeed/README.md): no fused kernels,
# CPU initialisation, gloo; no --use-flash-attn.
CPU_FLAGS = ["--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
             "--no-gradient-accumulation-fusion", "--use-cpu-initialization",
             "--distributed-backend", "gloo", "--num-workers", "0"]  # no loader processes
_PRINTED_MS = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_indexed_dataset(tmp_path_factory.mktemp("megatron-data") / "tiny_text_document")


def megatron_study(path: Path, env: MegatronEnv, data: Path, *, name: str, layout: dict[str, Any],
                   extra_args: tuple[str, ...] = (), python: str | None = None,
                   n_trials: int = 1, search: dict[str, Any] | None = None,
                   global_batch: int = 4, fork: str = "deepspeedai",
                   env_extra: dict[str, str] | None = None) -> Path:
    args = ["--data-path", str(data), "--tokenizer-type", "NullTokenizer", "--vocab-size",
            "255", "--split", "100,0,0", "--lr", "1e-4", *CPU_FLAGS, *extra_args]
    workload: dict[str, Any] = {
        "kind": "megatron-deepspeed",
        "script": str(env.fork(fork) / "pretrain_gpt.py"), "args": args,
        "env": {**env.env, "LOCAL_SIZE": "2", **(env_extra or {})}, "no_progress_s": 300}
    if python:
        workload["python"] = python
    axes = {"tp": [layout["tp"]], "pp": [layout["pp"]], "micro_batch": [layout["micro_batch"]],
            "zero_stage": [layout["zero_stage"]], "recompute": [layout["recompute"]],
            "sequence_parallel": [layout.get("sequence_parallel", False)],
            "ulysses": [layout.get("ulysses", 1)],
            "strategy": "cost-model-only", "n_trials": n_trials}
    return write_study(path, name=name, devices=2, n_trials=n_trials, db=path.parent / "m.db",
                       model=MODEL, training={"global_batch": global_batch, "dtype": "fp32"},
                       search={**axes, **(search or {})},
                       trial={"warmup_steps": 1, "measure_steps": 2, "timeout_s": 600,
                              "device": "cpu", "measure_precision": None},  # 3 iterations
                       workload=workload)


def _trials(path: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{path.parent / 'm.db'}"
                             ).get_trials()


@pytest.mark.parametrize("layout", LAYOUTS, ids=[row["id"] for row in LAYOUTS])
def test_a_real_pretrain_gpt_trial_is_measured_as_megatron_prints_it(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path, layout: dict[str, Any]) -> None:
    name = f"real-{layout['id']}"
    path = megatron_study(tmp_path / f"{name}.yaml", megatron_env, data, name=name,
                          layout=layout)
    proc = run_cli("run", str(path), timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # It calibrates on Megatron studies only (never the built-in trainer's).
    assert "cpu/fp32/megatron-deepspeed" in proc.stdout + proc.stderr
    (trial,) = _trials(path, name)
    assert trial.user_attrs["outcome"] == "complete", trial.user_attrs.get("reason")
    folder = Path(trial.user_attrs["trial_dir"])
    result = json.loads((folder / "result.json").read_text())
    assert result["readback"]["source"] == "megatron-deepspeedai"
    printed = _PRINTED_MS.findall((folder / "stdout.log").read_text())
    assert len(printed) == 3  # warm-up + 2 measured, as the trial asked
    assert [f"{s * 1000:.1f}" for s in result["step_times_s"]] == printed[1:]
    with create_engine(f"sqlite:///{tmp_path / 'm.db'}").connect() as conn:
        assert conn.execute(text("select workload from measurements where study_name = :n"),
                            {"n": name}).scalar() == "megatron-deepspeed"
    launch = json.loads((folder / "command.json").read_text())  # what ran, recorded
    assert "--tensor-model-parallel-size" in launch["argv"]
    # The layout's own axes reached Megatron as its own flags (and it ran with them).
    assert ("--sequence-parallel" in launch["argv"]) == layout.get("sequence_parallel", False)
    if layout["recompute"] != "none":
        at = launch["argv"].index("--recompute-granularity")
        assert launch["argv"][at + 1] == layout["recompute"]
    else:
        assert "--recompute-granularity" not in launch["argv"]
    assert launch["env"]["LOCAL_SIZE"] == "2" and launch["cwd"] == str(REPO)
    if layout is LAYOUTS[0]:  # once: the printed line reproduces the run, env included
        best = run_cli("best", str(path), "--emit", "command", "--out", str(tmp_path),
                       cwd=REPO)
        assert best.returncode == 0, best.stderr
        words = shlex.split(best.stdout.splitlines()[-1])
        launcher = words.index("torchrun")
        assigned = dict(w.split("=", 1) for w in words[:launcher])
        assert assigned == {**megatron_env.env, "LOCAL_SIZE": "2"}
        assert "--nproc-per-node=2" in words  # the study's two ranks
        python = words.index("--no-python") + 1
        assert words[python + 1].endswith("pretrain_gpt.py")
        # The production step count, for the user to fill: never the trial's 3.
        assert words[words.index("--train-iters") + 1] == "{train_iters}"


def test_an_address_space_limit_is_recorded_oom(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path) -> None:
    # pretrain_gpt.py under RLIMIT_AS (tests/workloads/programs/limit_as.py: what torch
    # and DeepSpeed map plus 1500 MiB, room for Megatron's start-up and gloo's threads: 300
    # MiB failed in gloo's thread creation, "Resource temporarily unavailable", no OOM).
    # The vocabulary padded to 65536 makes micro-batch 32's logits 512 MiB each
    # (32 x 64 x 65536 fp32), a few of which exceed it: PyTorch's CPU allocator raises
    # "DefaultCPUAllocator: can't allocate memory ... (Cannot allocate memory)".
    limited = tmp_path / "limited-python"
    limited.write_text(f"#!/bin/sh\nexec {sys.executable} "
                       f"{REPO / 'tests/workloads/programs/limit_as.py'} --budget-mb 1500 -- "
                       '"$@"\n')
    limited.chmod(0o755)
    path = megatron_study(tmp_path / "oom.yaml", megatron_env, data, name="real-oom",
                          layout={**LAYOUTS[2], "micro_batch": 32}, python=str(limited),
                          extra_args=("--make-vocab-size-divisible-by", "65536"),
                          global_batch=64)
    proc = run_cli("run", str(path), timeout=900, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-3000:]  # no trial completed
    (trial,) = _trials(path, "real-oom")
    assert trial.user_attrs["outcome"] == "oom", trial.user_attrs.get("reason")
    assert "Cannot allocate memory" in trial.user_attrs["reason"]


def test_a_misspelled_flag_stops_the_study_with_megatron_s_own_line(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path) -> None:
    path = megatron_study(tmp_path / "typo.yaml", megatron_env, data, name="real-typo",
                          layout=LAYOUTS[0], extra_args=("--hiden-dropout", "0.1"), n_trials=4,
                          search={"tp": [1, 2], "pp": [1, 2], "micro_batch": [1, 2]})
    proc = run_cli("run", str(path), timeout=900, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-3000:]
    trials = _trials(path, "real-typo")
    assert 1 <= len(trials) <= 2
    for trial in trials:
        first = trial.user_attrs["reason"].splitlines()[0]
        assert "error: unrecognized arguments: --hiden-dropout 0.1" in first, first
    assert "unrecognized arguments: --hiden-dropout" in proc.stderr


def test_a_sequence_parallel_trial_reaches_megatron_and_is_recorded_as_it_ends(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path) -> None:
    """``sequence_parallel`` reaches Megatron as ``--sequence-parallel``. In the pinned
    deepspeedai fork (4efb479 + PR #469) the non-flash attention path (the only one on a
    CPU) fails under it inside Megatron: ``ParallelAttention.forward`` splits the gathered
    QKV by thirds in its SP branch (``megatron/model/transformer.py``, the
    ``if self.sequence_parallel and not self.enable_ds_sequence_parallel`` block), and the
    scores then miss the mask (``megatron/model/utils.py`` ``attention_mask_func``: "The
    size of tensor a (32) must match the size of tensor b (64)"). autotune must record
    that as the program's own error line, not as its own crash; a checkout where SP runs
    must be measured as Megatron prints it."""
    layout = {"id": "tp2-sp", "tp": 2, "pp": 1, "micro_batch": 1, "zero_stage": 0,
              "recompute": "none", "sequence_parallel": True}
    path = megatron_study(tmp_path / "sp.yaml", megatron_env, data, name="real-sp",
                          layout=layout)
    proc = run_cli("run", str(path), timeout=900, cwd=REPO)
    (trial,) = _trials(path, "real-sp")
    folder = Path(trial.user_attrs["trial_dir"])
    launch = json.loads((folder / "command.json").read_text())
    assert "--sequence-parallel" in launch["argv"]
    assert "Traceback" not in proc.stdout + proc.stderr
    if trial.user_attrs["outcome"] == "complete":
        result = json.loads((folder / "result.json").read_text())
        printed = _PRINTED_MS.findall((folder / "stdout.log").read_text())
        assert [f"{s * 1000:.1f}" for s in result["step_times_s"]] == printed[1:]
        return
    assert proc.returncode == 1 and trial.user_attrs["outcome"] == "error"
    reason = trial.user_attrs["reason"]
    assert reason.startswith("RuntimeError: The size of tensor a"), reason
    assert "ChildFailedError" not in reason.splitlines()[0]
