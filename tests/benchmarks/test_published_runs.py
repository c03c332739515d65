"""benchmarks/published_runs.py: the planner against published full-scale runs, one plan
per run. The figures must be the shipped plan's own (a study file written by hand for the
run, planned by ``plan_study``), and a run whose published pair the plan cannot lay out
must say why in the plan's words, not vanish from the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.planning.plan import plan_study
from autotune.spec import parse_study
from benchmarks import published_runs as bench

TEMPLATE: dict[str, Any] = {
    "name": "published",
    "model": {"n_layer": 24, "hidden": 2048, "n_head": 16, "seq_len": 2048,
              "vocab_size": 51200, "attention": "explicit", "dropout": 0.1},
    "cluster": {"nodes": 2, "devices_per_node": 8, "device": "a100-80gb"},
    "training": {"global_batch": 256, "dtype": "bf16", "stack": "megatron"},
    "search": {"tp": [1, 2, 4, 8], "pp": [1], "micro_batch": [1, 2, 4], "zero_stage": [0],
               "recompute": ["full"]},
}
HEADER = "name,heads,hidden,layers,tp,pp,gpus,global_batch,tflops\n"


def _files(tmp_path: Path, rows: str) -> tuple[Path, Path]:
    template = tmp_path / "template.yaml"
    template.write_text(yaml.safe_dump(TEMPLATE))
    runs = tmp_path / "runs.csv"
    runs.write_text(HEADER + rows)
    return template, runs


def _by_hand(layers: int, hidden: int, heads: int, gpus: int, batch: int) -> dict[str, Any]:
    """The study file a user would write for one run: the template's settings, the run's
    shape and size, every divisor of the layer count as a pipeline degree."""
    data = json.loads(json.dumps(TEMPLATE))
    data["model"].update(n_layer=layers, hidden=hidden, n_head=heads)
    data["cluster"]["nodes"] = gpus // 8
    data["training"]["global_batch"] = batch
    data["search"]["pp"] = [d for d in range(1, layers + 1) if layers % d == 0]
    return data


def test_each_run_is_placed_in_its_own_plan(tmp_path: Path) -> None:
    template, runs = _files(tmp_path, "small,16,2048,24,2,2,32,256,140\n"
                                      "huge,64,8192,48,1,1,16,128,100\n"
                                      "wide,16,2048,24,16,1,32,256,140\n")
    out = tmp_path / "out.json"
    assert bench.main([str(template), str(runs), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}

    plan = plan_study(parse_study(_by_hand(24, 2048, 16, 32, 256)), top=10_000)
    pairs: list[tuple[int, int]] = []
    for row in plan.rows:
        if (row.layout.tp, row.layout.pp) not in pairs:
            pairs.append((row.layout.tp, row.layout.pp))
    mine = next(r for r in plan.rows if (r.layout.tp, r.layout.pp) == (2, 2))
    small = rows["small"]
    assert small["layout"] == mine.layout.key()
    assert small["predicted_tflops"] == pytest.approx(mine.step.hardware_tflops_per_device)
    assert small["error_pct"] == pytest.approx(
        100 * (mine.step.hardware_tflops_per_device / 140 - 1))
    assert small["pair_rank"] == pairs.index((2, 2)) + 1 and small["n_pairs"] == len(pairs)
    assert small["plan_best"] == plan.rows[0].layout.key()

    # A 39B model unsharded on one GPU's memory: excluded, in the plan's own words.
    assert rows["huge"]["pair_rank"] is None and rows["huge"]["predicted_tflops"] is None
    assert "excluded by memory" in rows["huge"]["note"]
    assert "not in the search space" in rows["wide"]["note"]
    summary = result["summary"]
    assert summary["rows"] == 3 and summary["predicted"] == 1
    assert summary["published_pair_without_layout"] == ["huge", "wide"]
    assert summary["median_abs_error_pct"] == pytest.approx(abs(small["error_pct"]))
    assert summary["pair_in_top"] == int(small["pair_rank"] <= 5)

    # Model TFLOPS leave out the recomputed forward: below the hardware figure.
    assert bench.main([str(template), str(runs), "--tflops", "model", "--json", str(out)]) == 0
    model = {r["name"]: r for r in json.loads(out.read_text())["rows"]}["small"]
    assert model["predicted_tflops"] == pytest.approx(mine.step.model_tflops_per_device)
    assert model["predicted_tflops"] < 0.8 * small["predicted_tflops"]


@pytest.mark.parametrize(("rows", "header", "said"), [
    ("x,16,2048,24,1,1,33,256,140\n", HEADER, "runs.csv:2: gpus: got 33; allowed: a multiple"),
    ("x,16,2048,24,one,1,32,256,140\n", HEADER, "runs.csv:2: tp: got 'one'"),
    ("x,16,2048,24,1,1,32,256,nan\n", HEADER, "runs.csv:2: tflops: got 'nan'"),
    ("x,16,2048,24,1,1,32,256\n", HEADER.replace(",tflops", ""), "missing ['tflops']"),
    ("x,15,2048,24,1,1,32,256,140\n", HEADER, "runs.csv:2: model.n_head: got 15"),
])
def test_a_bad_run_is_refused_naming_line_column_and_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, header: str,
        said: str) -> None:
    template, runs = _files(tmp_path, "")
    runs.write_text(header + rows)
    out = tmp_path / "out.json"
    assert bench.main([str(template), str(runs), "--json", str(out)]) == 2
    assert said in capsys.readouterr().err
    assert not out.exists()


def test_the_shipped_megatron_template_takes_a_run(tmp_path: Path) -> None:
    """``examples/published_runs/megatron_a100.yaml`` is a valid template: a run of its
    own placeholder shape is planned, its pipeline axis every divisor of the layers."""
    template = Path(bench.__file__).resolve().parents[1] / "examples/published_runs" \
        / "megatron_a100.yaml"
    runs = tmp_path / "runs.csv"
    runs.write_text(HEADER + "mine,24,2304,24,1,1,32,512,130\n")
    out = tmp_path / "out.json"
    assert bench.main([str(template), str(runs), "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["layout"].startswith("tp1-pp1-dp32-") and row["predicted_tflops"] > 0
    assert row["n_pairs"] > 4  # tp 1-8 times pp 1-24, those that divide 32 GPUs


def test_a_template_with_automatic_axes_places_runs_across_nodes_and_off_the_axis(
        tmp_path: Path) -> None:
    """``search.tp: auto`` is every divisor of the world: TP 16 on two 8-GPU nodes is
    searched and excluded (TP across nodes), TP 3 is not in the space at all."""
    template, runs = _files(tmp_path, "across,16,2048,24,16,1,32,256,140\n"
                                      "odd,16,2048,24,3,1,32,256,140\n")
    data = yaml.safe_load(template.read_text())
    data["search"]["tp"] = "auto"
    template.write_text(yaml.safe_dump(data))
    out = tmp_path / "out.json"
    assert bench.main([str(template), str(runs), "--json", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["across"]["pair_rank"] is None and "excluded by tp_cross_node" in \
        rows["across"]["note"]
    assert rows["odd"]["note"].startswith("not in the search space (search.tp [1, 2, 4, 8, 16,")
