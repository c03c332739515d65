"""``plan --scaling``: the base size's best layout held at every size (autotune/scaling/held.py)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.layout import Layout
from autotune.models.cost import estimate_step
from autotune.scaling.sizes import ScalingRequest, size_spec
from autotune.spec import load_study
from tests.helpers import REPO

STUDY_175B = str(REPO / "studies" / "lrz_gpt175b.yaml")
CPU_DEMO = str(REPO / "studies" / "cpu_demo.yaml")


def _plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("mode", ["weak", "strong"])
def test_the_175b_curve_with_its_16_node_layout_held(mode: str,
                                                     capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # its sqlite file does not exist here: uncalibrated
    nodes = "16,32,64,128"
    data = _plan_json(capsys, STUDY_175B, "--scaling", mode, "--nodes", nodes)
    best = {r["nodes"]: r["best_layout"] for r in data["rows"]}
    held = {h["nodes"]: h for h in data["held"]}
    assert sorted(held) == [16, 32, 64, 128]
    base = Layout.from_key(best[16])
    assert held[16]["layout"] == best[16] and held[16]["efficiency"] == 1.0
    spec = load_study(STUDY_175B)
    request = ScalingRequest(mode, "nodes", (16, 32, 64, 128))
    effs = []
    for size in (32, 64, 128):
        lay = Layout.from_key(held[size]["layout"])
        # Only the replicas and the micro-batches per step follow the size.
        assert replace(lay, dp=base.dp, grad_accum=base.grad_accum) == base
        assert lay.dp == base.dp * size // 16
        at = size_spec(spec, request, size)
        assert lay.dp * lay.micro_batch * lay.grad_accum == at.training.global_batch
        # The figure is the cost model's for that layout at that size, as plan predicts it.
        step = estimate_step(at.model, lay, at.cluster, dtype=at.training.dtype,
                             stack=at.training.stack)
        assert held[size]["model_tflops_per_device"] == pytest.approx(
            step.model_tflops_per_device, rel=1e-9)
        assert held[size]["efficiency_low"] < held[size]["efficiency"] \
            < held[size]["efficiency_high"]
        effs.append(held[size]["efficiency"])
    # One layout on more nodes: more replicas to reduce over and a slower slowest tile
    # (weak), and fewer micro-batches to fill the pipeline with (strong): never faster.
    assert effs == sorted(effs, reverse=True) and effs[-1] < 1.0
    # The sizes' own best layouts differ (the larger ones drop recompute or stages), so
    # the table shows the held curve under it, in the same words.
    assert any(best[n] != held[n]["layout"] for n in (32, 64, 128))
    assert main(["plan", STUDY_175B, "--scaling", mode, "--nodes", nodes]) == 0
    out = capsys.readouterr().out
    assert "nodes 16's best layout held at every size" in out
    assert f"nodes 128: {held[128]['layout']} " in out
    assert f"efficiency {100 * held[128]['efficiency']:.1f}%" in out


def test_a_held_layout_a_size_cannot_run_says_why(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # Strong scaling at a batch of 16: 1 device's best (micro-batch 4) has no whole
    # number of micro-batches per step on 8 devices.
    data = _plan_json(capsys, CPU_DEMO, "--scaling", "strong", "--devices", "1,2,4,8")
    held = {h["devices"]: h for h in data["held"]}
    assert Layout.from_key(held[1]["layout"]).micro_batch == 4
    assert held[8]["layout"] is None and held[8]["model_tflops_per_device"] is None
    assert held[8]["efficiency"] is None and "micro_batch" in held[8]["note"]
    assert main(["plan", CPU_DEMO, "--scaling", "strong", "--devices", "1,2,4,8"]) == 0
    out = capsys.readouterr().out
    assert "devices 8: cannot run: " in out and "micro_batch 4" in out
    # The CSV carries the same held curve beside each predicted row, for a spreadsheet.
    assert main(["plan", CPU_DEMO, "--scaling", "strong", "--devices", "1,2,4,8",
                 "--format", "csv"]) == 0
    rows = {int(r["devices"]): r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert list(rows[1])[:8] == ["nodes", "devices", "best_layout", "model_tflops_per_device",
                                 "tokens_per_s", "efficiency", "mode", "source"]  # contract
    for d in (1, 2, 4):
        assert rows[d]["held_layout"] == held[d]["layout"]
        assert float(rows[d]["held_efficiency"]) == pytest.approx(held[d]["efficiency"])
        assert float(rows[d]["held_model_tflops_per_device"]) == pytest.approx(
            held[d]["model_tflops_per_device"])
    assert float(rows[2]["held_efficiency_low"]) < float(rows[2]["held_efficiency"]) \
        < float(rows[2]["held_efficiency_high"])
    assert rows[8]["held_layout"] == "" and rows[8]["held_efficiency"] == ""  # not known
    assert rows[8]["held_note"] == held[8]["note"]


def test_no_held_curve_where_every_size_keeps_the_base_layout(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = _plan_json(capsys, CPU_DEMO, "--scaling", "weak", "--nodes", "1,2,4")
    assert [h["layout"] for h in data["held"]] == [r["best_layout"] for r in data["rows"]]
    assert [h["efficiency"] for h in data["held"]] == pytest.approx(
        [r["efficiency"] for r in data["rows"]])
    assert main(["plan", CPU_DEMO, "--scaling", "weak", "--nodes", "1,2,4"]) == 0
    assert "best layout held" not in capsys.readouterr().out  # the table already is it
