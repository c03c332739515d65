"""The exports of the ZeRO-3 variants and Ulysses: DeepSpeed config keys checked by the
project's DeepSpeed itself, and Megatron-DeepSpeed flags checked against each fork's own
``megatron/arguments.py`` (the pinned snapshots, found through AUTOTUNE_MEGATRON_DIR)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from autotune.dsconfig import batch_config
from autotune.layout import Layout
from autotune.workloads.megatron import conflicting_flag, layout_args, script_has_use_mics
from tests.conftest import unavailable

MICS = Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=2, zero_stage=3,
              zero_variant="mics", zero_shard=2)
HPZ = Layout(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=2, zero_stage=3,
             zero_variant="hpz", zero_shard=2)
ULY = Layout(tp=1, pp=1, dp=2, micro_batch=1, grad_accum=2, zero_stage=1, ulysses=2)


def test_deepspeed_config_keys() -> None:
    assert batch_config(MICS, "bf16")["zero_optimization"] == {
        "stage": 3, "mics_shard_size": 2, "mics_hierarchical_params_gather": False}
    assert batch_config(HPZ, "bf16")["zero_optimization"] == {
        "stage": 3, "zero_hpz_partition_size": 2}
    assert batch_config(ULY, "bf16")["zero_optimization"] == {"stage": 1}
    assert batch_config(ULY, "bf16")["train_batch_size"] == 4  # dp * mb * ga, not * ulysses


def test_the_projects_deepspeed_takes_hpz_and_refuses_mics() -> None:
    """DeepSpeed's own ZeRO config model: hpZ's key is read; 0.19 removed MiCS, whose key
    it refuses (the reason MiCS is offered only with an older DeepSpeed)."""
    import deepspeed
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from packaging.version import Version

    zero = DeepSpeedZeroConfig(**batch_config(HPZ, "bf16")["zero_optimization"])
    assert zero.zero_hpz_partition_size == 2
    if Version(deepspeed.__version__).release >= (0, 19):
        with pytest.raises(Exception, match="mics"):
            DeepSpeedZeroConfig(**batch_config(MICS, "bf16")["zero_optimization"])


def test_megatron_flags_and_owned_flags() -> None:
    assert layout_args(ULY, dtype="fp32")[-2:] == ["--ds-sequence-parallel-size", "2"]
    assert "--use-mics" in layout_args(MICS, dtype="fp32", use_mics=True)
    assert "--use-mics" not in layout_args(MICS, dtype="fp32")
    assert "--use-mics" not in layout_args(HPZ, dtype="fp32", use_mics=True)
    assert conflicting_flag(["--ds-sequence-parallel-size", "4"]) == \
        (0, "--ds-sequence-parallel-size", "--ds-sequence-parallel-size")
    assert conflicting_flag(["--use-mics"]) == (0, "--use-mics", "--use-mics")


def _forks() -> dict[str, Path]:
    source = os.environ.get("AUTOTUNE_MEGATRON_DIR")
    if not source:
        unavailable("Megatron-DeepSpeed", "AUTOTUNE_MEGATRON_DIR is not set",
                    script="scripts/megatron_env.sh")
    root = Path(str(source))
    dirs = [root] if (root / "pretrain_gpt.py").is_file() else sorted(root.iterdir())
    return {d.name: d for d in dirs if (d / "megatron" / "arguments.py").is_file()}


def _defined(fork: Path) -> set[str]:
    text = (fork / "megatron" / "arguments.py").read_text()
    return set(re.findall(r"""["'](--[a-z0-9-]+)["']""", text))


@pytest.mark.parametrize("prefix", ["deepspeedai", "argonne-lcf"])
def test_each_fork_defines_the_flags_it_is_given(prefix: str) -> None:
    forks = {n: p for n, p in _forks().items() if n.startswith(prefix)}
    if not forks:
        unavailable(f"fork {prefix}", "not under AUTOTUNE_MEGATRON_DIR",
                    script="scripts/megatron_env.sh")
    for fork in forks.values():
        defined = _defined(fork)
        scripts = sorted(fork.glob("pretrain_gpt*.py"))
        for lay in (ULY, HPZ, MICS):
            for script in scripts:
                flags = [a for a in layout_args(lay, dtype="bf16",
                                                use_mics=script_has_use_mics(str(script)))
                         if a.startswith("--") and a not in ("--no-pipeline-parallel",)]
                missing = [f for f in flags if f not in defined]
                assert not missing, (fork.name, script.name, lay.key(), missing)
        # Only argonne-lcf's pretrain_gpt_alcf.py builds the model under MiCS_Init.
        assert [s.name for s in scripts if script_has_use_mics(str(s))] == (
            ["pretrain_gpt_alcf.py"] if prefix == "argonne-lcf" else [])
