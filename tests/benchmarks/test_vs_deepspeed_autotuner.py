"""``benchmarks/vs_deepspeed_autotuner.py``'s reading and scoring (issue #24).

``data/ds_autotuner_z0/`` is a real results folder of DeepSpeed 0.19.8's Autotuner
(``deepspeed --autotuning tune`` through ``benchmarks/_ds_autotuner_local.py`` on
``examples/deepspeed_gpt/train_ds_autotuner.py``, ZeRO 0 x micro-batch {1, 2}, 2 CPU
ranks, global batch 4), with the wrapper's launch lines beside it; ``data/ds_autotuner_grid/``
is the benchmark's own 12-point grid (its first full run, logs left out). Nothing here launches
anything: the benchmark itself runs both tools (docs/vs-deepspeed-autotuner.md).
"""

from __future__ import annotations

import doctest
import json
import sqlite3
from pathlib import Path

import pytest

from benchmarks import _vs_deepspeed
from benchmarks import vs_deepspeed_autotuner as bench
from benchmarks._vs_deepspeed import (
    autotune_best_key,
    autotune_cost,
    autotuner_config,
    parse_truth,
    read_autotuner_best,
    read_autotuner_metrics,
    read_launches,
    relative_to_best,
    space_points,
    train_py_truth_line,
    union_seconds,
)

DATA = Path(__file__).parent / "data"


def test_reads_the_autotuners_own_output_folder() -> None:
    results = DATA / "ds_autotuner_z0"
    assert read_autotuner_best(results) == "z0-mb2"
    measured = read_autotuner_metrics(results)
    assert set(measured) == {"z0-mb1", "z0-mb2"}  # the profile run is no point
    # its named best is its highest metric, as its summary.txt says
    assert max(measured, key=lambda k: measured[k]) == "z0-mb2"
    assert "z0_gas1_tmbspg2" in (results / "summary.txt").read_text()


def test_a_point_without_metrics_is_what_the_autotuner_records_as_zero(tmp_path: Path
                                                                        ) -> None:
    exp = tmp_path / "z1_gas1_tmbspg8"
    exp.mkdir()
    (exp / "exp.json").write_text(json.dumps({"ds_config": {
        "train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1}}}))
    assert read_autotuner_metrics(tmp_path) == {"z1-mb8": 0.0}
    assert read_autotuner_best(tmp_path) is None  # no ds_config_optimal.json: none named


def test_launches_and_device_seconds_of_the_wrapper() -> None:
    launches, device_s = read_launches(DATA / "ds_autotuner_z0_launches.jsonl")
    lines = [json.loads(x) for x in
             (DATA / "ds_autotuner_z0_launches.jsonl").read_text().splitlines()]
    assert launches == 3 == len(lines)  # the model-info profile run + 2 points
    assert device_s == pytest.approx(sum(2 * r["wall_s"] for r in lines))


def test_the_autotuner_config_keeps_the_global_batch_fixed(tmp_path: Path) -> None:
    cfg = autotuner_config([0, 1, 2], [1, 2, 4, 8], global_batch=16, ranks=2,
                           results_dir=tmp_path / "r", exps_dir=tmp_path / "e")
    # DeepSpeed's run_tuning_micro_batch_sizes: gas = max(mbs) * config gas // mbs
    per_gpu = max(cfg["train_micro_batch_size_per_gpu"]) * cfg["gradient_accumulation_steps"]
    for mbs in cfg["train_micro_batch_size_per_gpu"]:
        assert mbs * (per_gpu // mbs) * 2 == 16
    assert cfg["zero_optimization"] == {"stage": [0, 1, 2]}
    assert cfg["autotuning"]["fast"] is True
    # the folder checked in here came from the same keys
    shipped = json.loads((DATA / "ds_autotuner_z0_ds_config.json").read_text())
    assert set(shipped["autotuning"]) <= set(cfg["autotuning"])


def test_ground_truth_drops_each_points_first_step_and_takes_medians() -> None:
    lines = ["truth z0-mb4 round 1 step_s 5.0 0.2 0.2 0.3",
             "truth z1-mb8 round 1 step_s 4.0 0.1 0.1",
             "truth z0-mb4 round 2 step_s 0.4 0.4 0.4",  # first step kept: not a warm-up
             "truth z1-mb8 round 2 step_s 0.1 0.2 0.1",
             "truth z0-mb4 round 3 step_s 0.2 0.2 0.2",
             "[rank0] DeepSpeed info line"]
    truth = parse_truth(lines, global_batch=16)
    assert truth == {"z0-mb4": pytest.approx(80.0), "z1-mb8": pytest.approx(160.0)}
    assert relative_to_best(truth, "z0-mb4") == pytest.approx(0.5)
    assert relative_to_best(truth, None) == 0.0


def test_launch_mode_truth_drops_every_launchs_first_step() -> None:
    out = "\n".join(f"step {i}/4 | time {t} s | loss 5.5" for i, t in
                    enumerate((2.0, 0.1, 0.1, 0.2), 1))
    lines = [train_py_truth_line("z0-mb8", r, out) for r in (1, 2)]
    assert lines[0] == "truth z0-mb8 round 1 step_s 2.0 0.1 0.1 0.2"
    assert parse_truth(lines, global_batch=16, warmup_every_line=True) == {
        "z0-mb8": pytest.approx(160.0)}


def test_autotune_cost_counts_a_shared_launch_once(tmp_path: Path) -> None:
    db = tmp_path / "study.db"
    with sqlite3.connect(db) as con:
        con.execute("create table measurements (study_name text, started_at text, "
                    "finished_at text, world_size int)")
        con.executemany("insert into measurements values (?, ?, ?, ?)", [
            ("s", "2026-12-01 10:00:00", "2026-12-01 10:00:30", 2),
            ("s", "2026-12-01 10:00:10", "2026-12-01 10:00:30", 2),  # same launch
            ("s", "2026-12-01 10:01:00", "2026-12-01 10:01:20", 2),
            ("other", "2026-12-01 09:00:00", "2026-12-01 11:00:00", 2)])
    for trial in ("0", "2"):
        (tmp_path / "runs" / trial).mkdir(parents=True)
        (tmp_path / "runs" / trial / "command.json").write_text("{}")
    assert autotune_cost(db, "s", tmp_path / "runs") == (2, pytest.approx(100.0))
    with sqlite3.connect(db) as con:  # a confirmation round records its own cost
        con.execute("create table confirmations (study_name text, launches int, "
                    "device_s real)")
        con.executemany("insert into confirmations values (?, ?, ?)",
                        [("s", 2, 50.0), ("other", 9, 999.0)])
    assert autotune_cost(db, "s", tmp_path / "runs") == (2, pytest.approx(150.0))
    assert union_seconds([(0, 10), (5, 12), (20, 21)]) == 13


def test_autotune_best_key_reads_best_emit_json() -> None:
    out = json.dumps({"study": "s", "layout": {"tp": 1, "pp": 1, "dp": 2, "micro_batch": 4,
                                               "grad_accum": 2, "zero_stage": 1}})
    assert autotune_best_key(out) == "z1-mb4"


def test_the_space_is_every_point_that_divides_the_global_batch() -> None:
    assert len(space_points([0, 1, 2], [1, 2, 4, 8], global_batch=16, ranks=2)) == 12


@pytest.mark.parametrize("argv, needle", [
    (["--micro-batch", "3"], "--micro-batch: 3 does not divide --global-batch 16"),
    (["--zero", "3"], "--zero: 3 is not allowed"),
    (["--repetitions", "-1"], "--repetitions: -1 is not allowed"),
    (["--truth-rounds", "0"], "--truth-rounds: 0 is not allowed"),
])
def test_bad_input_exits_2_naming_the_flag(argv: list[str], needle: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse_args([*argv, "--tools", "autotune"])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_the_helpers_examples_hold() -> None:
    # pytest leaves benchmarks/ out of its doctest collection (pyproject: --ignore)
    assert doctest.testmod(_vs_deepspeed).failed == 0


def test_the_shipped_study_is_the_benchmarks_default_space() -> None:
    from autotune.planning.space import enumerate_layouts
    from autotune.spec import load_study

    spec = load_study(bench.STUDY)
    a = bench.parse_args(["--tools", "autotune"])
    world = spec.cluster.nodes * spec.cluster.devices_per_node
    assert world == a.ranks and spec.training.global_batch == a.global_batch
    layouts = enumerate_layouts(spec.search, world, spec.training.global_batch)
    assert sorted(f"z{x.zero_stage}-mb{x.micro_batch}" for x in layouts) == sorted(a.points)
    # the same program for both tools: train.py, whose model the autotuner's copy imports
    assert "examples/deepspeed_gpt/train.py" in spec.workload.argv


def test_truth_from_reuses_an_earlier_runs_ground_truth(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"ground_truth": {"z0-mb4": 145.0, "z0-mb8": 173.0,
                                                    "z1-mb8": 120.0}}))
    a = bench.parse_args(["--zero", "0", "--micro-batch", "4", "8", "--tools", "autotune",
                          "--truth-from", str(earlier)])
    assert bench.earlier_truth(a) == {"z0-mb4": 145.0, "z0-mb8": 173.0}
    a = bench.parse_args(["--tools", "autotune", "--truth-from", str(earlier)])
    with pytest.raises(SystemExit) as exc:
        bench.earlier_truth(a)
    assert exc.value.code == 2
    assert "--truth-from" in capsys.readouterr().err


def test_reads_the_autotuners_folder_of_the_benchmarks_own_grid(tmp_path: Path) -> None:
    # data/ds_autotuner_grid: repetition 1 of the full benchmark run (docs: "Figures"),
    # its stdout/stderr logs left out; the config is the one autotuner_config writes
    results = DATA / "ds_autotuner_grid"
    shipped = json.loads((DATA / "ds_autotuner_grid_ds_config.json").read_text())
    ours = autotuner_config([0, 1, 2], [1, 2, 4, 8], global_batch=16, ranks=2,
                            results_dir=Path(shipped["autotuning"]["results_dir"]),
                            exps_dir=Path(shipped["autotuning"]["exps_dir"]))
    assert shipped == ours
    measured = read_autotuner_metrics(results)
    assert sorted(measured) == sorted(space_points([0, 1, 2], [1, 2, 4, 8], global_batch=16,
                                                   ranks=2))
    assert read_autotuner_best(results) == max(measured, key=lambda k: measured[k]) == "z1-mb8"
    launches, _ = read_launches(DATA / "ds_autotuner_grid_launches.jsonl")
    assert launches == 13  # 1 model-info profile run + the 12 points


def test_a_truth_that_does_not_repeat_scores_no_tool(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    a = bench.parse_args(["--zero", "0", "1", "--micro-batch", "8", "--tools", "autotune"])
    assert a.truth_repeats == 2
    rows = [{"autotune": {"best": "z1-mb8", "launches": 5, "device_seconds": 100.0,
                          "wall_s": 50.0}}]
    # The week's case: one truth named z1-mb8, the next z0-mb8.
    moved = [{"z0-mb8": 100.0, "z1-mb8": 110.0}, {"z0-mb8": 110.0, "z1-mb8": 100.0}]
    out = bench.report(a, moved, [dict(r) for r in rows], show=False)
    assert not out["truth_repeatability"]["repeats"]
    assert out["truth_repeatability"]["bests"] == ["z1-mb8", "z0-mb8"]
    assert out["tools"]["autotune"]["within_5pct"] is None
    assert out["ground_truths"] == moved
    steady = [{"z0-mb8": 100.0, "z1-mb8": 110.0}, {"z0-mb8": 101.0, "z1-mb8": 112.0}]
    out = bench.report(a, steady, [dict(r) for r in rows], show=True)
    assert out["truth_repeatability"]["repeats"] and out["ground_truth_best"] == "z1-mb8"
    assert out["tools"]["autotune"]["within_5pct"] == 1
    assert "ground truth repeats" in capsys.readouterr().out


def test_the_tools_run_under_this_interpreters_installation(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Both tools' commands say ``python`` and ``deepspeed``: the ones beside the
    interpreter running the benchmark come first on their PATH, so ``.venv/bin/python
    benchmarks/vs_deepspeed_autotuner.py`` without an activated environment measures the
    .venv (it ran both on the system python: "No module named 'deepspeed'", 0 scored)."""
    import sys

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = bench.base_env(tmp_path, 2)
    first, *rest = env["PATH"].split(":")
    assert first == str(Path(sys.executable).parent) and rest == ["/usr/bin", "/bin"]
    assert env["LOCAL_SIZE"] == "2"
