"""Dropout in the built-in trainer: seeded, where Megatron places it, and the same model
whatever the layout (:mod:`trainer.dropout`).

With the explicit attention path every mask is a function of (seed, layer, micro-batch,
site, global head), so TP, PP, sequence parallelism and either recompute train exactly as
the single-device run does; the fused path's attention dropout draws per TP rank (as
Megatron's), so only its pipeline layouts are compared with the reference.
"""

from __future__ import annotations

from typing import Any

import pytest
from trainer_launch import TINY_MODEL, launch, spec

pytestmark = pytest.mark.slow

DROP = {**TINY_MODEL, "dropout": 0.3, "attention": "explicit"}
DROP_FLASH = {**TINY_MODEL, "dropout": 0.3}


def _sp(s: dict) -> dict:
    s["layout"]["sequence_parallel"] = True
    return s


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("dropout")
    by_world: dict[int, dict[str, dict]] = {
        1: {"ref": spec(model=DROP), "again": spec(model=DROP),
            "none": spec(model={**DROP, "dropout": 0.0}),
            "full": spec(model=DROP, recompute="full"),
            "selective": spec(model=DROP, recompute="selective"),
            "flash_ref": spec(model=DROP_FLASH),
            "flash_full": spec(model=DROP_FLASH, recompute="full")},
        2: {"tp2": spec(2, 1, 1, model=DROP), "pp2": spec(1, 2, 1, model=DROP),
            "flash_pp2": spec(1, 2, 1, model=DROP_FLASH)},
        4: {"tp2pp2_full": spec(2, 2, 1, model=DROP, recompute="full"),
            "sp_tp2pp2": _sp(spec(2, 2, 1, model=DROP)),
            "sp_tp2pp2_selective": _sp(spec(2, 2, 1, model=DROP, recompute="selective"))},
    }
    results: dict[str, Any] = {}
    for world, specs in by_world.items():
        code, out = launch(tmp, world, specs, torchrun=world > 1)
        assert code == 0, (world, {k: v.get("error") for k, v in out.items()})
        results.update(out)
    return results


def test_dropout_is_applied_and_seeded(trials: dict) -> None:
    ref = trials["ref"]["losses"]
    assert trials["again"]["losses"] == ref  # same seed, same masks
    assert trials["none"]["losses"][0] != pytest.approx(ref[0], rel=1e-3)  # it drops out


@pytest.mark.parametrize("name", ["full", "selective", "tp2", "pp2", "tp2pp2_full",
                                  "sp_tp2pp2", "sp_tp2pp2_selective"])
def test_layouts_train_the_same_model_with_dropout(trials: dict, name: str) -> None:
    assert trials[name]["losses"] == pytest.approx(trials["ref"]["losses"], rel=1e-4)


@pytest.mark.parametrize("name", ["flash_full", "flash_pp2"])
def test_fused_attention_dropout_recomputes_and_pipelines_exactly(trials: dict,
                                                                  name: str) -> None:
    assert trials[name]["losses"] == pytest.approx(trials["flash_ref"]["losses"], rel=1e-4)
