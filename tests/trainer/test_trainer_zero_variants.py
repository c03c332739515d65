"""The built-in trainer runs ZeRO-3's hpZ for real with the project's DeepSpeed on CPU
(gloo), with the plain layout's losses (fp32, within 1e-4) and the engine checked to run
hpZ (``trainer/zero_variants.py``). MiCS: tests/megatron/test_trainer_mics.py (it needs
the test-only DeepSpeed 0.18.9)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_launch import launch, spec

pytestmark = pytest.mark.slow


def _variant(variant: str, shard: int) -> dict:
    s = spec(1, 1, 4, zero=3, global_batch=8)
    s["layout"].update(zero_variant=variant, zero_shard=shard)
    return s


def test_hpz_reaches_the_plain_layouts_losses(tmp_path: Path) -> None:
    code, ref = launch(tmp_path, 1, {"ref": spec(global_batch=8)}, torchrun=False)
    assert code == 0, ref
    code, out = launch(tmp_path, 4, {"hpz2": _variant("hpz", 2),
                                     "z3": spec(1, 1, 4, zero=3, global_batch=8)})
    assert code == 0, {k: v.get("error") for k, v in out.items()}
    for name in ("hpz2", "z3"):
        assert out[name]["status"] == "ok", out[name]["error"]
        assert out[name]["losses"] == pytest.approx(ref["ref"]["losses"], abs=1e-4)
