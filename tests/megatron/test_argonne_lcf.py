"""The argonne-lcf fork (the Aurora / Intel Max users' Megatron-DeepSpeed) through
``autotune run`` on CPU, for real: its ``pretrain_gpt.py`` with ezpz (mpi4py on MPICH's
runtime wheel, ``scripts/megatron_env.sh``), 2 ranks over gloo, the tiny GPT and data of
``test_pretrain_gpt.py``. Test ids name the fork.

Each layout must be measured ``complete`` from the fork's own ``training_log`` lines (rich
colours removed: :mod:`autotune.workloads.log_text`), with stored step times equal to the
printed ``elapsed_time_per_iteration_ms``. Megatron's sequence parallelism and
DeepSpeed-Ulysses are run too: where the fork fails on CPU, the trial must keep the fork's
own error line as its reason (the docstring of each says what stops it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.helpers import REPO, run_cli
from tests.megatron.conftest import ENV_DIR, MegatronEnv
from tests.megatron.test_pretrain_gpt import data, megatron_study  # noqa: F401 (fixture)

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

FORK = "argonne-lcf"
LAYOUTS: list[dict[str, Any]] = [
    {"id": "argonne-lcf-tp2", "tp": 2, "pp": 1, "micro_batch": 1, "zero_stage": 0,
     "recompute": "none"},
    {"id": "argonne-lcf-pp2", "tp": 1, "pp": 2, "micro_batch": 1, "zero_stage": 0,
     "recompute": "none"},
    {"id": "argonne-lcf-dp2", "tp": 1, "pp": 1, "micro_batch": 1, "zero_stage": 0,
     "recompute": "none"},
]
# AuroraGPT's norm (ALCF's launch scripts pass it). With the default layernorm, off CUDA the
# fork's LayerNorm is torch.nn.LayerNorm (megatron/model/__init__.py line 26), to which
# GPTModelPipe passes sequence_parallel= (megatron/model/gpt_model.py line 470): every
# pp > 1 trial stops there (test_a_layout_the_fork_rejects_keeps_its_own_error_line).
RMSNORM = ("--normalization", "rmsnorm")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_PRINTED_MS = re.compile(r"elapsed_time_per_iteration_ms=([0-9.]+)")


def argonne_env() -> dict[str, str]:
    """What the argonne trials need beside the deepspeedai fork's: the wandb/tensorboard
    stubs, ezpz, mpi4py with the MPI library it loads, and ezpz's own imports."""
    path = ":".join(str(ENV_DIR / p) for p in ("deepspeed", "site", "argonne", "ezpz",
                                               "mpi/site", "argonne-site"))
    return {"PYTHONPATH": path,
            "MPI4PY_LIBMPI": (ENV_DIR / "mpi" / "libmpi").read_text().strip()}


def _run(tmp_path: Path, env: MegatronEnv, dataset: Path, layout: dict[str, Any],
         extra_args: tuple[str, ...] = RMSNORM) -> tuple[Any, optuna.trial.FrozenTrial, Path]:
    name = f"real-{layout['id']}"
    path = megatron_study(tmp_path / f"{name}.yaml", env, dataset, name=name, layout=layout,
                          fork=FORK, env_extra=argonne_env(), extra_args=extra_args)
    proc = run_cli("run", str(path), timeout=900, cwd=REPO)
    (trial,) = optuna.load_study(study_name=name,
                                 storage=f"sqlite:///{tmp_path / 'm.db'}").get_trials()
    return proc, trial, Path(trial.user_attrs["trial_dir"])


def _printed(folder: Path) -> list[str]:
    return _PRINTED_MS.findall(_ANSI.sub("", (folder / "stdout.log").read_text()))


@pytest.mark.parametrize("layout", LAYOUTS, ids=[row["id"] for row in LAYOUTS])
def test_the_argonne_lcf_fork_is_measured_as_it_prints(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path,  # noqa: F811
        layout: dict[str, Any]) -> None:
    proc, trial, folder = _run(tmp_path, megatron_env, data, layout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert trial.user_attrs["outcome"] == "complete", trial.user_attrs.get("reason")
    result = json.loads((folder / "result.json").read_text())
    assert result["readback"]["source"] == "megatron-argonne"
    printed = _printed(folder)
    assert len(printed) == 3  # warm-up + 2 measured
    assert [f"{s * 1000:.1f}" for s in result["step_times_s"]] == printed[1:]
    argv = json.loads((folder / "command.json").read_text())["argv"]
    assert any(a.endswith("argonne-lcf-ffa3456/pretrain_gpt.py") for a in argv)
    at = argv.index("--tensor-model-parallel-size")
    assert argv[at + 1] == str(layout["tp"])


def _ends_as_the_fork_ends_it(proc: Any, trial: optuna.trial.FrozenTrial, folder: Path,
                              flag: str, expected_error: str) -> None:
    """Complete and read back as printed where the fork runs it; else an ``error`` whose
    reason is the fork's own error line (never autotune's crash, never torchrun's)."""
    argv = json.loads((folder / "command.json").read_text())["argv"]
    assert flag in argv
    assert "Traceback" not in proc.stdout + proc.stderr
    if trial.user_attrs["outcome"] == "complete":
        result = json.loads((folder / "result.json").read_text())
        assert [f"{s * 1000:.1f}" for s in result["step_times_s"]] == _printed(folder)[1:]
        return
    assert proc.returncode == 1 and trial.user_attrs["outcome"] == "error"
    first = trial.user_attrs["reason"].splitlines()[0]
    assert expected_error in first, first
    assert "ChildFailedError" not in first


def test_a_layout_the_fork_rejects_keeps_its_own_error_line(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path) -> None:  # noqa: F811
    """pp = 2 with the default layernorm: the fork's GPTModelPipe gives torch's LayerNorm a
    ``sequence_parallel`` argument (see :data:`RMSNORM`); the trial's reason is that line."""
    layout = {**LAYOUTS[1], "id": "argonne-lcf-pp2-layernorm"}
    proc, trial, _folder = _run(tmp_path, megatron_env, data, layout, extra_args=())
    assert proc.returncode == 1 and trial.user_attrs["outcome"] == "error"
    first = trial.user_attrs["reason"].splitlines()[0]
    assert first == ("TypeError: LayerNorm.__init__() got an unexpected keyword argument "
                     "'sequence_parallel'"), first


def test_the_argonne_lcf_forks_sequence_parallelism_on_cpu(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path) -> None:  # noqa: F811
    """Megatron's ``--sequence-parallel`` at tp = 2 in the argonne-lcf fork, on CPU. At
    ffa3456 it stops as the deepspeedai fork does: the non-flash attention path
    (``megatron/model/transformer.py`` line 1020, ``core_attention``; ``fused_softmax.py``
    line 196, ``forward_torch_softmax``) reaches ``megatron/model/utils.py`` line 50,
    ``attention_mask_func``'s ``masked_fill_``, with scores of 32 positions against the
    64-position mask. The reason kept is that line."""
    layout = {"id": "argonne-lcf-tp2-sp", "tp": 2, "pp": 1, "micro_batch": 1,
              "zero_stage": 0, "recompute": "none", "sequence_parallel": True}
    proc, trial, folder = _run(tmp_path, megatron_env, data, layout)
    _ends_as_the_fork_ends_it(proc, trial, folder, "--sequence-parallel",
                              "RuntimeError: The size of tensor a")


def test_the_argonne_lcf_forks_ulysses_on_cpu(
        tmp_path: Path, megatron_env: MegatronEnv, data: Path) -> None:  # noqa: F811
    """DeepSpeed-Ulysses (``--ds-sequence-parallel-size 2``) in the argonne-lcf fork. On
    CPU (the non-flash path) it stops at ``megatron/model/transformer.py`` line 989:
    ``self.dist_attn(query_layer, key_layer, value_layer, attention_mask)`` hands the mask
    to DeepSpeed 0.18.9's ``DistributedAttention.forward(query, key, value,
    batch_dim_idx, ...)`` (``deepspeed/sequence/layer.py`` line 367) as ``batch_dim_idx``,
    and ``_generate_layout_params`` (line 24, ``if batch_dim_idx == 0``) fails on it."""
    layout = {"id": "argonne-lcf-ulysses2", "tp": 1, "pp": 1, "micro_batch": 1,
              "zero_stage": 0, "recompute": "none", "ulysses": 2}
    proc, trial, folder = _run(tmp_path, megatron_env, data, layout)
    _ends_as_the_fork_ends_it(proc, trial, folder, "--ds-sequence-parallel-size",
                              "RuntimeError: Boolean value of Tensor with more than one value")
