"""Sequence parallelism with pipeline parallelism and ZeRO in the built-in trainer (fp32,
CPU, 4 ranks): the losses equal those of the same layout without it.

Under SP the TP ranks hold different sequence shards, so DeepSpeed's partitioned pipeline
sends (on by default) would assemble the receiver's activation from pieces of different
shards: this is the check that :func:`autotune.dsconfig.pipeline_partitioning` turns them
off (before it, tp2-pp2-sp's first loss was off by 0.01). The tp2/pp1 cases and selective
recompute are in ``tests/models/test_memory_sp_selective.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_launch import launch, spec

pytestmark = pytest.mark.slow


def _sp(s: dict) -> dict:
    s["layout"]["sequence_parallel"] = True
    return s


def test_sequence_parallel_with_a_pipeline_and_zero_trains_like_the_plain_layout(
        tmp_path: Path) -> None:
    specs = {"plain": spec(2, 2, 1),
             "sp": _sp(spec(2, 2, 1)),
             "sp_selective_z1": _sp(spec(2, 2, 1, zero=1, recompute="selective"))}
    code, out = launch(tmp_path, 4, specs)
    assert code == 0, {k: v.get("error") for k, v in out.items()}
    plain = out["plain"]["losses"]
    assert len(plain) == 3
    for name in ("sp", "sp_selective_z1"):
        assert out[name]["status"] == "ok"
        assert out[name]["layout"]["sequence_parallel"] is True
        assert out[name]["losses"] == pytest.approx(plain, abs=1e-4), name
