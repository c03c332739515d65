"""``benchmarks/_errors.py``: the per-table error of ``cost_model_accuracy.py``, pooled over
groups and split by parallelism class (issue #32: find which terms carry the optimism)."""

from __future__ import annotations

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.landscape import LandscapeGroup, Measurement
from autotune.layout import Layout
from autotune.models.cost import estimate_step

MODEL = ModelConfig(n_layer=24, hidden=2048, n_head=16, seq_len=1024, vocab_size=51200,
                    attention="explicit", dropout=0.1)
CLUSTER = ClusterConfig(nodes=1, devices_per_node=8, device="a100-80gb")
LAYOUTS = (Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=4, recompute="full"),
           Layout(tp=2, pp=1, dp=4, micro_batch=1, grad_accum=8, recompute="full"),
           Layout(tp=4, pp=1, dp=2, micro_batch=2, grad_accum=8, recompute="full"),
           Layout(tp=1, pp=2, dp=4, micro_batch=1, grad_accum=8, recompute="full"),
           Layout(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=8, recompute="full"))
# What each row "measured", as a factor of the cost model's own prediction: the tp > 1
# rows at 0.8 (the model 25% optimistic there), the others at 1.
FACTOR = {lay: 0.8 if lay.tp > 1 else 1.0 for lay in LAYOUTS}


def _group() -> LandscapeGroup:
    rows = tuple(Measurement(lay, "ok", FACTOR[lay] * estimate_step(
        MODEL, lay, CLUSTER, dtype="bf16", stack="megatron").model_tflops_per_device, None)
        for lay in LAYOUTS)
    return LandscapeGroup("g", MODEL, CLUSTER, 32, "bf16", rows, stack="megatron")


def test_errors_by_parallelism_class() -> None:
    from benchmarks import _errors as errors

    table = errors.TableErrors("t.csv")
    table.add(errors.group_errors(_group()))
    table.add(errors.group_errors(_group()))  # pooled over groups
    doc = table.to_dict()
    assert doc["n_rows"] == 10 and doc["predicted_high"] == 6
    classes = doc["by_parallelism"]
    assert list(classes) == ["tp1-pp1", "tp>1-pp1", "tp1-pp>1", "tp>1-pp>1"]
    assert [c["n_rows"] for c in classes.values()] == [2, 4, 2, 2]
    assert classes["tp1-pp1"]["median_pct_error"] == pytest.approx(0.0, abs=1e-9)
    assert classes["tp1-pp>1"]["median_abs_pct_error"] == pytest.approx(0.0, abs=1e-9)
    for cls in ("tp>1-pp1", "tp>1-pp>1"):
        assert classes[cls]["median_pct_error"] == pytest.approx(25.0)
    # Pooled, the median says 25% as if every row were optimistic; the classes say that
    # only the TP rows are.
    assert doc["median_pct_error"] == pytest.approx(25.0)
    # One model-parallel axis alone, by its degree: tp 2 and 4 (pp 1), pp 2 (tp 1); the
    # rows with both axes or neither are in no degree.
    degrees = doc["by_degree"]
    assert list(degrees) == ["tp2", "tp4", "pp2"]
    assert [d["n_rows"] for d in degrees.values()] == [2, 2, 2]
    assert degrees["tp2"]["median_pct_error"] == pytest.approx(25.0)
    assert degrees["tp4"]["median_abs_pct_error"] == pytest.approx(25.0)
    assert degrees["pp2"]["median_pct_error"] == pytest.approx(0.0, abs=1e-9)


def test_degrees_sort_by_axis_then_degree() -> None:
    from benchmarks import _errors as errors

    table = errors.TableErrors("t.csv")
    keys = ["pp16", "tp8", None, "pp2", "tp2", "tp16", None]
    table.add(errors.GroupErrors([float(i) for i in range(len(keys))], [True] * len(keys),
                                 [1.0] * len(keys), ["c"] * len(keys), keys))
    assert list(table.by_degree()) == ["tp2", "tp8", "tp16", "pp2", "pp16"]
    assert table.by_degree()["tp8"]["median_pct_error"] == 1.0


def test_printed_table_has_a_line_per_class(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import _errors as errors

    table = errors.TableErrors("dir/t.csv")
    table.add(errors.group_errors(_group()))
    errors.print_tables([table, errors.TableErrors("empty.csv")])
    out = capsys.readouterr().out.splitlines()
    assert "band width" in out[1]
    assert out[2].startswith("t.csv ")
    assert [line.split()[0] for line in out[3:]] == ["tp1-pp1", "tp>1-pp1", "tp1-pp>1",
                                                     "tp>1-pp>1", "tp2", "tp4", "pp2"]
    assert "+25.0%" in out[4] and "+0.0%" in out[3]
    assert out[7].split()[:3] == ["tp2", "(pp", "1)"] and "+25.0%" in out[7]
    assert out[9].split()[:3] == ["pp2", "(tp", "1)"] and "+0.0%" in out[9]
