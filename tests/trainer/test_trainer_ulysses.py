"""DeepSpeed-Ulysses in the built-in trainer, for real on CPU (gloo, the project's
DeepSpeed 0.19.8: ``deepspeed.sequence.layer.DistributedAttention``): the sequence split
over 2 ranks reaches the single-device reference's losses (fp32, within 1e-4) at ZeRO 0,
1 and 3, alone and with data parallelism beside it (``trainer/ulysses.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_launch import launch, spec

pytestmark = pytest.mark.slow


def _ulysses(dp: int, zero: int) -> dict:
    s = spec(1, 1, dp, zero=zero, global_batch=8)
    s["layout"]["ulysses"] = 2
    return s


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp: Path = tmp_path_factory.mktemp("ulysses")
    code, ref = launch(tmp, 1, {"ref": spec(global_batch=8)}, torchrun=False)
    assert code == 0, ref
    code, two = launch(tmp, 2, {"uly2_z0": _ulysses(1, 0), "uly2_z1": _ulysses(1, 1),
                                "uly2_z3": _ulysses(1, 3)})
    code4, four = launch(tmp, 4, {"uly2_dp2_z1": _ulysses(2, 1)})
    assert code4 == 0, {k: v.get("error") for k, v in four.items()}
    return {**ref, **two, **four}


@pytest.mark.parametrize("name", ["uly2_z0", "uly2_z1", "uly2_z3", "uly2_dp2_z1"])
def test_ulysses_reaches_the_plain_layouts_losses(trials: dict, name: str) -> None:
    got = trials[name]
    assert got["status"] == "ok", got["error"]
    assert got["world_size"] == (4 if "dp2" in name else 2)
    assert got["losses"] == pytest.approx(trials["ref"]["losses"], abs=1e-4)
