"""A study file with ``launcher.kind: replay``: the table is the space, the CLI end to end."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.helpers import run_cli, write_study

HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
          "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n")
# One 4-GPU group at global batch 8 (8 layouts; tp4-pp1-mb2 fastest) and one at 16.
ROWS = [  # gpus, gb, mb, tp, dp, pp, ms
    (4, 8, 1, 1, 4, 1, 120.0), (4, 8, 2, 1, 4, 1, 110.0), (4, 8, 1, 2, 2, 1, 100.0),
    (4, 8, 2, 2, 2, 1, 95.0), (4, 8, 1, 4, 1, 1, 90.0), (4, 8, 2, 4, 1, 1, 80.0),
    (4, 8, 1, 1, 2, 2, 130.0), (4, 8, 1, 1, 1, 4, 150.0), (4, 16, 1, 1, 4, 1, 200.0),
]


def _landscape(path: Path) -> Path:
    lines = [f"{g},{gb},{mb},1024,16,12,1024,{tp},{dp},{pp},{ms}"
             for g, gb, mb, tp, dp, pp, ms in ROWS]
    path.write_text(HEADER + "\n".join(lines) + "\n")
    return path


def _study(tmp_path: Path, n_trials: int = 8, **replay: object) -> Path:
    _landscape(tmp_path / "vtrain.csv")
    return write_study(
        tmp_path / "replay.yaml", name="replayed", n_trials=n_trials,
        model={"n_layer": 12, "hidden": 1024, "n_head": 16, "seq_len": 1024,
               "attention": "explicit"},
        cluster={"nodes": 1, "devices_per_node": 4, "device": "a100-80gb"},
        training={"global_batch": 8, "dtype": "bf16"},
        # Narrow axes: a replay searches the table's rows whatever the study's space says.
        search={"tp": [1], "pp": [1], "n_trials": n_trials},
        launcher={"kind": "replay", "run_dir": str(tmp_path / "runs"),
                  "replay": {"landscape": "vtrain.csv", **replay}})


def test_a_replayed_study_measures_the_table_and_finds_its_best(tmp_path: Path) -> None:
    study = _study(tmp_path)
    proc = run_cli("run", str(study), cwd=tmp_path.parent)  # the CSV path is study-relative
    assert proc.returncode == 0, proc.stderr
    # The study says bf16 of a table measured in fp16: predicted as it says, and told so.
    assert "note: the table was measured in fp16; training.dtype bf16 predicts bf16's " \
           "memory (write fp16 to predict the table's runs)" in proc.stderr
    best = run_cli("best", str(study), "--emit", "json")
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["layout"]["tp"] == 4  # tp4-pp1-dp1-mb2: 80 ms
    assert json.loads(best.stdout)["layout"]["micro_batch"] == 2
    status = run_cli("status", str(study))
    assert status.returncode == 0 and "8" in status.stdout


def test_a_study_no_group_matches_is_refused_with_the_groups_listed(tmp_path: Path) -> None:
    study = _study(tmp_path)
    text = study.read_text().replace("global_batch: 8", "global_batch: 32")
    study.write_text(text)
    proc = run_cli("run", str(study))
    assert proc.returncode == 2
    assert "launcher.replay.landscape" in proc.stderr and "global batch 32" in proc.stderr
    assert "vtrain-4gpu-h1024-a16-l12-s1024-gb8" in proc.stderr  # the groups it could take
    assert not (tmp_path / "study.db").exists()  # refused before the database is opened
    # The group it misses by the fewest differences, and how, so the key to change is named.
    assert ("(closest: group 0 vtrain-4gpu-h1024-a16-l12-s1024-gb8: global batch 8 "
            "(study: 32))") in proc.stderr


def test_the_closest_group_names_every_difference(tmp_path: Path) -> None:
    study = _study(tmp_path)
    study.write_text(study.read_text().replace("hidden: 1024", "hidden: 2048"))
    proc = run_cli("run", str(study))
    assert proc.returncode == 2
    # Both groups differ in the model; the gb-8 one in nothing else, the gb-16 one in batch.
    assert "(closest: group 0 vtrain-4gpu-h1024-a16-l12-s1024-gb8: model hidden 1024 " \
           "(study: 2048)" in proc.stderr


def test_a_group_index_out_of_range_or_of_another_batch_names_the_field(tmp_path: Path) -> None:
    proc = run_cli("run", str(_study(tmp_path, group=5)))
    assert proc.returncode == 2 and "launcher.replay.group: got 5; allowed: 0..1" in proc.stderr
    proc = run_cli("run", str(_study(tmp_path, group=1)))
    assert proc.returncode == 2 and "global batch 16 (study: 8)" in proc.stderr


def test_a_missing_landscape_file_names_the_field(tmp_path: Path) -> None:
    study = _study(tmp_path)
    study.write_text(study.read_text().replace("landscape: vtrain.csv", "landscape: nope.csv"))
    proc = run_cli("run", str(study))
    assert proc.returncode == 2 and "launcher.replay.landscape: got 'nope.csv'" in proc.stderr


def test_a_table_measured_in_fp16_replays_as_fp16_and_nothing_else_runs_it(
        tmp_path: Path) -> None:
    # vTrain's tables were measured in fp16: a replay says so and the models take fp16's
    # optimizer at the BF16 peak; the same study file launching trials is refused.
    study = _study(tmp_path, n_trials=3)
    study.write_text(study.read_text().replace("dtype: bf16", "dtype: fp16"))
    proc = run_cli("run", str(study))
    assert proc.returncode == 0, proc.stderr
    assert "note: the table was measured in" not in proc.stderr
    with sqlite3.connect(tmp_path / "study.db") as conn:
        rows = conn.execute("select dtype, model_tflops_per_device, predicted_tflops_per_device "
                            "from measurements").fetchall()
    assert len(rows) == 3
    assert all(d == "fp16" and measured > 0 and predicted > 1 for d, measured, predicted in rows)
    study.write_text(study.read_text().replace("kind: replay", "kind: local"))
    (tmp_path / "study.db").unlink()
    proc = run_cli("run", str(study))
    assert proc.returncode == 2
    assert "training.dtype: got 'fp16'; allowed: one of 'bf16', 'fp32'; 'fp16' only with " \
           "launcher.kind: replay" in proc.stderr and "not with 'local'" in proc.stderr
    assert not (tmp_path / "study.db").exists()


def test_plan_ranks_the_rows_a_replayed_run_measures(tmp_path: Path) -> None:
    # Before, `plan` ranked the search axes' space (ZeRO-1, no recompute: none of the table's
    # rows), while `run` measured the table and its refusal told the user to run `plan`.
    study = _study(tmp_path, n_trials=1)
    proc = run_cli("plan", str(study), "--format", "json", cwd=tmp_path.parent)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["n_layouts"] == 8 and plan["n_feasible"] == 8  # the gb-8 group's rows
    table = {(g, mb, tp, dp, pp) for g, gb, mb, tp, dp, pp, _ in ROWS if gb == 8}
    keys = {(4, r["layout"]["micro_batch"], r["layout"]["tp"], r["layout"]["dp"],
             r["layout"]["pp"]) for r in plan["feasible"]}
    assert keys == table
    assert all(r["layout"]["recompute"] == "full" for r in plan["feasible"])
    # The run's first trial is the plan's first row (nothing measured yet: the same prior).
    assert run_cli("run", str(study), cwd=tmp_path.parent).returncode == 0
    best = json.loads(run_cli("best", str(study), "--emit", "json").stdout)
    assert best["layout"] == plan["feasible"][0]["layout"]


def test_search_axes_that_form_no_layout_do_not_refuse_a_replay(tmp_path: Path) -> None:
    # The table is the space: axes that form nothing on 4 devices are not its business.
    study = _study(tmp_path, n_trials=2)
    study.write_text(study.read_text().replace("tp:\n  - 1", "tp:\n  - 3"))
    assert "- 3" in study.read_text()
    proc = run_cli("run", str(study), cwd=tmp_path.parent)
    assert proc.returncode == 0, proc.stderr


def test_run_and_plan_give_one_reason_for_a_table_with_no_feasible_row(tmp_path: Path) -> None:
    # Checked as a real study on a 0.5 GiB device, no row of the table fits. `run` said only
    # "no feasible layout in the replayed table" and sent the user to `plan`; now both say
    # what excluded the rows, in the same words.
    study = _study(tmp_path, n_trials=2, study_check=True)
    study.write_text(study.read_text().replace("device: a100-80gb",
                                               "device: a100-80gb\n  memory_gb: 0.5"))
    ran = run_cli("run", str(study), cwd=tmp_path.parent)
    planned = run_cli("plan", str(study), cwd=tmp_path.parent)
    assert ran.returncode == 2 and planned.returncode == 2, (ran.stderr, planned.stderr)
    reason = ("no feasible layout in the search space: all 8 rows of the replayed table "
              "are excluded; 8 excluded by memory, e.g. ")
    assert reason in ran.stderr and reason in planned.stderr
    assert "autotune plan" in ran.stderr  # where the whole list is


def test_a_scaling_size_the_table_lacks_is_refused_before_anything_runs(tmp_path: Path) -> None:
    study = _study(tmp_path)  # the table holds 4-GPU groups only
    for argv in (("plan", str(study), "--scaling", "strong", "--devices", "2,4"),
                 ("scaling", str(study), "--mode", "strong", "--devices", "4,2")):
        proc = run_cli(*argv, cwd=tmp_path.parent)
        assert proc.returncode == 2, proc.stderr
        assert "no group of the file matches the study's model, world size 2" in proc.stderr
        assert not list(tmp_path.rglob("*.db"))  # nothing run, no database written
    proc = run_cli("plan", str(study), "--scaling", "strong", "--devices", "4",
                   "--format", "json", cwd=tmp_path.parent)
    assert proc.returncode == 0, proc.stderr
    best = json.loads(proc.stdout)["rows"][0]["best_layout"]
    table = {f"tp{tp}-pp{pp}-dp{dp}-mb{mb}-ga{8 // (dp * mb)}-z0-full"
             for _, gb, mb, tp, dp, pp, _ in ROWS if gb == 8}
    assert best in table  # one of the table's rows (full recompute), not of the axes' space


def test_landscapes_lists_the_groups_a_study_can_match(tmp_path: Path) -> None:
    table = _landscape(tmp_path / "vtrain.csv")
    proc = run_cli("landscapes", str(table))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "2 group(s)" in lines[0] and lines[1].split()[:5] == [
        "index", "name", "device", "devices", "global_batch"]
    assert lines[3].split()[:5] == ["0", "vtrain-4gpu-h1024-a16-l12-s1024-gb8", "a100-80gb",
                                    "4", "8"]
    assert "tp4-pp1-dp1-mb2-ga4-z0-full" in lines[3]  # its fastest row, 80 ms
    groups = json.loads(run_cli("landscapes", str(table), "--format", "json").stdout)
    assert [(g["index"], g["global_batch"], g["rows"], g["ok"]) for g in groups] == [
        (0, 8, 8, 8), (1, 16, 1, 1)]
    assert groups[0]["hidden"] == 1024 and groups[0]["stack"] == "megatron-deepspeed-either"
    from autotune.landscape.listing import SUMMARY_COLUMNS

    assert tuple(groups[0]) == SUMMARY_COLUMNS
    shipped = run_cli("landscapes", "aurora_pvc_70b.csv")  # a shipped table by its name
    assert shipped.returncode == 0 and "38 group(s)" in shipped.stdout
    missing = run_cli("landscapes", str(tmp_path / "nope.csv"))
    assert missing.returncode == 2 and "CSV: got" in missing.stderr


def test_a_binary_landscape_names_the_study_key(tmp_path: Path) -> None:
    study = _study(tmp_path)
    (tmp_path / "vtrain.csv").write_bytes(b"\x7fELF\x02\x01\xd0\xff")
    proc = run_cli("run", str(study), cwd=tmp_path.parent)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "launcher.replay.landscape: got 'vtrain.csv'; not UTF-8 text" in proc.stderr


def test_a_wall_time_budget_spent_before_the_first_trial_says_so(tmp_path: Path) -> None:
    # Before: "no trial completed: see the reasons above and the trial logs under runs/...",
    # with no reason above and no log there.
    proc = run_cli("run", str(_study(tmp_path)), "--timeout", "1e-9", cwd=tmp_path.parent)
    assert proc.returncode == 1
    assert "ran out before the first trial; give more time" in proc.stderr
    assert "trial logs" not in proc.stderr
