"""The landscape loader: both formats, FLOPs conversions, grouping, dedupe and errors."""

from __future__ import annotations

import io
import math
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.landscape import (
    DEFAULT_AURORA_VOCAB,
    DEFAULT_VTRAIN_VOCAB,
    SHIPPED_LANDSCAPES,
    load_landscape,
    shipped_landscape,
    table_stack,
)
from autotune.layout import Layout
from autotune.models.flops import hardware_flops_per_step, model_flops_per_step

VTRAIN_HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
                 "sequence length,tensor parallelism,data parallelism,pipeline parallelism,"
                 "iteration time (ms)\n")
AURORA_HEADER = ("model,params_b,n_layer,hidden,ffn_hidden,heads,kv_heads,seq_len,nodes,"
                 "devices,pp,dp,tp,micro_batch,grad_accum,global_batch,zero_stage,zero_variant,"
                 "activation_checkpointing,torch_version,status,tflops_per_device,"
                 "samples_per_s,table\n")
AURORA_ROWS = (
    "m70,69,80,8192,28672,64,8,8192,8,96,8,12,1,1,1,12,1,,true,2.5,oom,,,t25\n"
    "m70,69,80,8192,28672,64,8,8192,8,96,8,6,2,1,2,12,1,,true,2.5,ok,17.75,0.936,t25\n"
    "m70,69,80,8192,28672,64,8,8192,8,96,8,6,2,1,2,12,1,,false,2.5,ok,20.0,1.0,t25\n"
    "m70,69,80,8192,28672,64,8,8192,8,96,8,6,2,1,2,12,1,,true,2.8,ok,50.0,2.0,t28\n"
)


def _load(text: str, **kw):
    return load_landscape(io.StringIO(text), **kw)


def test_vtrain_throughput_from_iteration_time():
    [g] = _load(VTRAIN_HEADER + "4,16,2,1024,16,24,1024,2,2,1,250\n")
    m = g.measurements[0]
    assert m.layout == Layout(tp=2, pp=1, dp=2, micro_batch=2, grad_accum=4, zero_stage=0,
                              recompute="full")
    expected = model_flops_per_step(g.model, 16) / (0.25 * 4) / 1e12
    assert math.isclose(m.model_tflops_per_device, expected)
    assert m.iteration_time_s == 0.25
    assert g.model.vocab_size == 51200 and g.dtype == "fp16"  # vTrain ran fp16
    assert g.cluster.device == "a100-80gb" and g.cluster.world_size == 4


def test_vtrain_extra_leading_column_and_options():
    text = ("Parameters (billion)," + VTRAIN_HEADER
            + "0.3,8,8,1,1024,16,24,1024,1,8,1,100\n0.3,8,8,2,1024,16,24,1024,1,4,2,90\n")
    [g] = _load(text, hardware="h100", devices_per_node=4, vocab_size=32000)
    assert g.cluster.device == "h100" and g.cluster.nodes == 2
    assert g.model.vocab_size == 32000
    assert g.best().layout.pp == 2


def test_vtrain_groups_by_model_gpus_and_batch():
    text = VTRAIN_HEADER + ("2,8,1,1024,16,24,1024,1,2,1,500\n"
                            "2,16,1,1024,16,24,1024,1,2,1,900\n"
                            "2,8,2,1024,16,24,1024,2,1,1,400\n")
    groups = _load(text)
    assert [len(g.measurements) for g in groups] == [2, 1]


def test_aurora_hardware_to_model_flops_groups_and_oom():
    groups = {g.name: g for g in _load(AURORA_HEADER + AURORA_ROWS)}
    assert set(groups) == {"m70-96dev-gb12-t25", "m70-96dev-gb12-t28"}
    g = groups["m70-96dev-gb12-t25"]
    assert g.cluster.devices_per_node == 12 and g.cluster.device == "max1550-tile"
    assert g.model.kv_heads == 8 and g.model.ffn == 28672 and g.model.mlp == "swiglu"
    assert g.model.vocab_size == 32000  # the format's own (Llama 2's), not vTrain's 51200
    [told] = _load(AURORA_HEADER + AURORA_ROWS.splitlines(keepends=True)[1], vocab_size=50304)
    assert told.model.vocab_size == 50304
    oom, ckpt, nockpt = g.measurements
    assert oom.status == "oom" and oom.model_tflops_per_device is None
    ratio = model_flops_per_step(g.model, 12) / hardware_flops_per_step(g.model, 12,
                                                                        recompute=True)
    assert math.isclose(ckpt.model_tflops_per_device, 17.75 * ratio)
    assert ckpt.layout.recompute == "full" and nockpt.layout.recompute == "none"
    assert math.isclose(nockpt.model_tflops_per_device, 20.0)  # no recompute: same FLOPs
    assert math.isclose(ckpt.iteration_time_s, 12 / 0.936)
    assert g.best() is nockpt and len(g.ok()) == 2


def test_duplicate_layouts_are_averaged():
    text = VTRAIN_HEADER + ("2,8,1,1024,16,24,1024,1,2,1,500\n"
                            "2,8,1,1024,16,24,1024,1,2,1,300\n")
    [g] = _load(text)
    assert len(g.measurements) == 1
    assert math.isclose(g.measurements[0].iteration_time_s, 0.4)


@pytest.mark.parametrize("text, needle", [
    (VTRAIN_HEADER + "2,8,1,1024,16,24,1024,1,2,1,abc\n", "line 2, column 'iteration time"),
    (VTRAIN_HEADER + "4,8,1,1024,16,24,1024,1,2,1,100\n", "line 2, column '# GPUs'"),
    (VTRAIN_HEADER + "2,8,1,1024,16,24\n", "line 2"),
    (VTRAIN_HEADER + "2,8,3,1024,16,24,1024,1,2,1,100\n", "column 'global batch'"),
    ("a,b,c\n1,2,3\n", "unknown format"),
    (AURORA_HEADER.replace("kv_heads,", "") + "x\n", "missing column(s) 'kv_heads'"),
    (AURORA_HEADER + AURORA_ROWS.replace("oom", "weird"), "column 'status'"),
    # Positive numbers whose throughput no result may hold (infinite, or beyond any device):
    # before, 'inf' and 1e-300 ms reached the database writer as an infinite TFLOPS.
    (VTRAIN_HEADER + "2,8,1,1024,16,24,1024,1,2,1,inf\n",
     "column 'iteration time (ms)': got 'inf'; allowed: a positive number"),
    (VTRAIN_HEADER + "2,8,1,1024,16,24,1024,1,2,1,1e-300\n",
     "column 'iteration time (ms)': got '1e-300'; gives inf model TFLOPS per device; "
     "allowed: a value that gives at most 100000"),
    (VTRAIN_HEADER + "2,8,1,1024,16,24,1024,1,2,1,1e-3\n", "gives 9.95e+06 model TFLOPS"),
    (AURORA_HEADER + AURORA_ROWS.replace(",17.75,", ",1e9,"),
     "column 'tflops_per_device': got '1e9'; gives"),
])
def test_malformed_files_name_the_line_and_column(text, needle):
    with pytest.raises(SpecError) as err:
        _load(text)
    assert needle in str(err.value)


def test_missing_file():
    with pytest.raises(SpecError, match="no such file"):
        load_landscape("/nonexistent/landscape.csv")


def test_shipped_landscapes_load():
    vtrain = load_landscape(shipped_landscape("vtrain_a100_single_node.csv"))
    assert len(vtrain) == 144
    assert sum(len(g.measurements) >= 8 for g in vtrain) == 88
    aurora = load_landscape(shipped_landscape("aurora_pvc_70b.csv"))
    assert sum(len(g.measurements) for g in aurora) == 41
    assert all(0 < m.model_tflops_per_device < 200 for g in aurora for m in g.ok())
    # SwiGLU (3 MLP matrices) and the format's vocabulary (Llama 2's 32000 tokens, untied,
    # as ALCF's scripts run it) recover the file's own params_b, 68.98B, less our learned
    # positions (8192 x 8192), within 0.01B; GPT-2's padded 51200 would not (69.29B).
    m70 = next(g.model for g in aurora if g.model.name == "auroragpt-70b")
    assert m70.vocab_size == DEFAULT_AURORA_VOCAB == 32000
    positions = m70.seq_len * m70.hidden
    assert abs((m70.n_params() - positions) / 1e9 - 68.98) < 0.01
    gpt2 = replace(m70, vocab_size=DEFAULT_VTRAIN_VOCAB)
    assert abs((gpt2.n_params() - positions) / 1e9 - 68.98) > 0.25


def test_the_shipped_tables_are_in_the_checkout_with_their_licences():
    folder = shipped_landscape(SHIPPED_LANDSCAPES[0]).parent
    assert folder == Path(__file__).resolve().parents[1] / "data" / "landscapes"
    assert {p.name for p in folder.iterdir()} >= {*SHIPPED_LANDSCAPES, "LICENSE.vtrain",
                                                  "README.md"}
    readme = (folder / "README.md").read_text()
    assert all(name in readme for name in SHIPPED_LANDSCAPES)
    with pytest.raises(SpecError, match=r"allowed: one of vtrain_a100_single_node\.csv"):
        shipped_landscape("nope.csv")


def test_a_byte_order_mark_is_read_and_a_binary_file_is_named(tmp_path: Path) -> None:
    # A table saved by a spreadsheet starts with a BOM: before, its first column was
    # '\ufeff# GPUs' and the file was refused for missing '# GPUs'; the stack, read from
    # the header alone, was unknown.
    text = VTRAIN_HEADER + "4,16,2,1024,16,24,1024,2,2,1,250\n"
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    [g] = load_landscape(bom)
    assert g.best().layout.tp == 2
    plain = _plain(tmp_path, text)
    assert table_stack(plain) is not None and table_stack(bom) == table_stack(plain)
    [s] = _load("\ufeff" + text)
    assert s.measurements == g.measurements
    binary = tmp_path / "table.csv"
    binary.write_bytes(b"\x7fELF\x02\x01\xd0\xff")
    with pytest.raises(SpecError, match=r"not UTF-8 text \(byte 6\)"):
        load_landscape(binary)


def _plain(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plain.csv"
    path.write_text(text)
    return path
