"""The Aurora table's ZeRO-3 variant rows join the layout space (``zero_variant``), and the
cost-model benchmark reports them (benchmarks/_zero3_rows.py)."""

from __future__ import annotations

import io

import pytest

from autotune.errors import SpecError
from autotune.landscape import load_landscape, shipped_landscape
from benchmarks._zero3_rows import zero3_variant_report


def test_the_shipped_variant_rows_map_onto_the_axis() -> None:
    groups = load_landscape(shipped_landscape("aurora_pvc_70b.csv"))
    by_table: dict[str, set[tuple[str, int]]] = {}
    for g in groups:
        table = g.name.rsplit("-", 1)[-1]
        for m in g.measurements:
            by_table.setdefault(table, set()).add((m.layout.zero_variant, m.layout.zero_shard))
    assert by_table["zero3_hpz"] == {("hpz", 12)}
    # A bare 'mics' is the whole data-parallel group (the notes state no group size).
    assert by_table["zero3_mics_run1"] == by_table["zero3_mics_run2"] == {
        ("mics", 48), ("mics", 96), ("mics", 192)}
    assert by_table["pp_zero1_torch25"] == {("none", 1)}


HEADER = ("model,n_layer,hidden,ffn_hidden,heads,kv_heads,seq_len,nodes,devices,pp,dp,tp,"
          "micro_batch,grad_accum,global_batch,zero_stage,zero_variant,"
          "activation_checkpointing,status,tflops_per_device,samples_per_s,table\n")
ROW = "m,2,64,256,4,4,64,1,4,1,4,1,1,1,4,{z},{v},true,ok,10,1,t\n"


@pytest.mark.parametrize(("z", "v", "where"), [("3", "zpp", "zero_variant"),
                                               ("1", "mics", "zero_variant")])
def test_a_bad_variant_names_the_line_and_column(z: str, v: str, where: str) -> None:
    with pytest.raises(SpecError) as err:
        load_landscape(io.StringIO(HEADER + ROW.format(z=z, v=v)), hardware="cpu")
    assert "line 2" in err.value.field and where in err.value.field


def test_the_benchmark_reports_error_and_rank_of_the_variant_rows() -> None:
    groups = load_landscape(shipped_landscape("aurora_pvc_70b.csv"))
    report = zero3_variant_report(groups)
    n = report["n_rows"]
    assert n == sum(len(g.ok()) for g in groups)
    variants = {r["zero_variant"] for r in report["rows"]}
    assert variants == {"mics", "hpz"}
    assert len(report["mics_ranks"]) == 6
    for r in report["rows"]:
        assert 1 <= r["predicted_rank"] <= n and 1 <= r["measured_rank"] <= n
        assert r["error"] == pytest.approx(r["predicted_tflops"] / r["measured_tflops"] - 1)
    assert set(report["median_abs_error"]) == {"mics", "hpz"}
