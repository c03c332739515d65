"""The smaller first-day items: scaling's report CSV and JSON, percent efficiency,
``--help`` and ``--version``, help texts, the reason truncated at a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import build_parser, main
from autotune.scaling.sizes import ScalingRequest
from autotune.scaling.table import ScalingRow
from tests.helpers import REPO


def test_plan_scaling_json(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    study = str(REPO / "studies" / "lrz_gpt175b.yaml")
    assert main(["plan", study, "--scaling", "weak", "--nodes", "16,128", "--format", "json",
                 "--no-learn"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "weak" and [r["nodes"] for r in data["rows"]] == [16, 128]
    assert data["rows"][0]["efficiency"] == 1.0


def test_plan_scaling_from_sizes_no_layout_fits(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The default sizes of a 175B study start at 1 node, where nothing fits: the table
    says why, and the efficiency is against the smallest size with a layout (before, every
    size's efficiency was '-' without a word)."""
    monkeypatch.chdir(tmp_path)
    study = str(REPO / "studies" / "lrz_gpt175b.yaml")
    args = ["plan", study, "--scaling", "weak", "--nodes", "1,16,128", "--no-learn"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "efficiency against nodes 16, the smallest size with a layout" in out
    reason = next(line for line in out.splitlines() if line.startswith("nodes 1: "))
    # the words `autotune run` refuses that size's study with (one text for one fact)
    assert reason.startswith("nodes 1: no feasible layout in the search space: all ")
    assert "excluded by memory" in reason and "GiB" in reason
    lines = out.splitlines()
    assert "100%" in next(line for line in lines if line.startswith("16 "))
    assert main([*args, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["efficiency_base"] == 16 and list(data["no_layout"]) == ["1"]
    effs = {r["nodes"]: r["efficiency"] for r in data["rows"]}
    # 128 nodes may pass 100%: ZeRO-1 over 16 replicas frees the memory to drop recompute
    # (superlinear from memory, docs/scaling.md); the size's own throughput is the check.
    assert effs[1] is None and effs[16] == 1.0 and effs[128] > 0.9
    assert main([*args, "--format", "csv"]) == 0
    csv_lines = capsys.readouterr().out.splitlines()
    assert csv_lines[0].startswith("nodes,devices,best_layout") and len(csv_lines) == 4


def test_scaling_report_writes_its_csv_beside_the_plot_and_percent(tmp_path: Path) -> None:
    from autotune.scaling.command import write_report
    from autotune.spec import load_study

    spec = load_study(REPO / "studies" / "cpu_demo.yaml")
    request = ScalingRequest("weak", "nodes", (1, 2))
    rows = [ScalingRow(size=n, study=f"s{n}", nodes=n, devices=4 * n,
                       best_layout="tp1-pp1-dp4-mb4-ga1-z1-none",
                       model_tflops_per_device=1.0 / n, tokens_per_s=100.0, mode="weak",
                       source="measured", global_batch=16 * n, efficiency=e)
            for n, e in ((1, 1.0), (2, 0.4139))]
    other = tmp_path / "other.csv"
    report = write_report(rows, request, spec, tmp_path / "rep", "md", csv_path=other)
    assert (tmp_path / "rep" / "scaling.csv").read_text() == other.read_text()
    text = report.read_text()
    assert "41%" in text and "0.4139" not in text


def test_help_opens_for_users_and_version() -> None:
    parser = build_parser()
    text = parser.format_help()
    assert "Thin: parse" not in text
    assert text.splitlines()[2].startswith("Find the fastest parallel layout")
    assert "first steps:" in text
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--version"])
    assert exit_.value.code == 0


@pytest.mark.parametrize(("command", "flag"), [("status", "--storage"), ("best", "--storage"),
                                               ("report", "--storage"), ("plan", "--top"),
                                               ("dashboard", "--port")])
def test_flags_have_help(command: str, flag: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
               ).choices[command]
    action = next(a for a in sub._actions if flag in a.option_strings)
    assert action.help, (command, flag)


def test_a_stored_reason_starts_at_a_word_with_an_ellipsis() -> None:
    from autotune.trial.reason_text import tail_at_word

    text = "Traceback ... " + "x" * 10 + " ERROR? " * 300 + "8 step(s) of 10 ran"
    cut = tail_at_word(text, 1500)
    assert len(cut) <= 1500 and cut.startswith("… ERROR?") and cut.endswith("10 ran")
    assert tail_at_word("y" * 20, 10) == "… " + "y" * 8  # one long word: cut where it must


def test_long_text_cells_of_html_tables_wrap() -> None:
    import pandas as pd

    from autotune.report.render import Report, Section, Table, render

    frame = pd.DataFrame({"trial": [1], "where": ["start-up 31%; " * 8]})
    page = render(Report("t", meta=[], sections=[Section("s", [Table(frame)])]), "html")
    assert "<td class='text'>start-up 31%" in page and "td.text { min-width" in page


@pytest.mark.parametrize(("flags", "named"), [
    (["--emit", "json", "--site", "aurora", "--steps", "5"],
     "--site, --steps go with --emit slurm"),
    (["--emit", "deepspeed", "--time", "00:30:00"], "--time go with --emit slurm"),
    (["--emit", "megatron-deepspeed", "--out", "cfg"], "--emit megatron-deepspeed only prints"),
    (["--out", "cfg"], "--emit json only prints"),
])
def test_best_refuses_a_flag_its_emit_does_not_use(flags: list[str], named: str,
                                                   capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, ``best --emit json --site aurora`` printed JSON and ignored the site, and
    ``--out`` with a format that writes nothing left the user looking for a file: now a
    usage error that names the flag (exit 2), before any database is opened."""
    monkeypatch.chdir(tmp_path)
    assert main(["best", "no-such-study.yaml", *flags]) == 2
    err = capsys.readouterr().err
    assert named in err and "no-such-study" not in err
    assert not list(tmp_path.iterdir())  # no database, no --out folder


def test_run_refuses_a_budget_for_a_round_it_turns_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-confirm --confirm-budget 0.2`` says two things: argparse's usage error names
    both flags (exit 2; before, the budget was silently dropped)."""
    with pytest.raises(SystemExit) as stop:
        main(["run", "missing.yaml", "--no-confirm", "--confirm-budget", "0.2"])
    assert stop.value.code == 2
    assert "--confirm-budget: not allowed with argument --no-confirm" in capsys.readouterr().err


def test_plan_refuses_top_with_scaling(capsys: pytest.CaptureFixture[str]) -> None:
    """``--top`` lists one size's layouts; with ``--scaling`` it was silently ignored."""
    study = str(REPO / "studies" / "lrz_gpt175b.yaml")
    assert main(["plan", study, "--scaling", "weak", "--nodes", "16", "--top", "3"]) == 2
    assert "--top K lists the best layouts of one size" in capsys.readouterr().err
    assert main(["plan", study, "--top", "3", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 4  # header and 3 layouts


def test_an_output_path_that_cannot_be_written_is_an_error_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: a FileNotFoundError/NotADirectoryError traceback, exit 1 (report --out,
    # profile --out, scaling --csv, best --out all write through the atomic writer).
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    study = str(REPO / "studies" / "lrz_gpt175b.yaml")
    csv_path = blocker / "s.csv"
    assert main(["scaling", study, "--mode", "weak", "--nodes", "16", "--table-only",
                 "--storage", f"sqlite:///{tmp_path / 'none.db'}",
                 "--csv", str(csv_path)]) == 2
    err = capsys.readouterr().err
    assert f"autotune: error: {csv_path.parent}" in err or f"autotune: error: {csv_path}" in err
    assert "Traceback" not in err


def test_the_atomic_writer_names_the_target_not_its_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from autotune.util.atomic import write_text_atomic

    def fail(src: object, dst: object) -> None:  # the rename fails, naming its source
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(os, "replace", fail)
    target = tmp_path / "gone" / "x.json"
    with pytest.raises(PermissionError) as err:
        write_text_atomic(target, "{}\n")
    assert err.value.filename == str(target)  # not .x.<pid>.<hex>.tmp.json
    assert not list(target.parent.iterdir())  # the temporary file is removed


@pytest.mark.parametrize(("flags", "needle"), [
    (["--reference", "3=50"], "--reference: got '3=50'; allowed: a size of the table (1, 2)"),
    (["--reference", "2=50", "--format", "json"], "--format json has none"),
])
def test_plan_scaling_refuses_a_reference_it_would_not_show(
        flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: exit 0, the reference silently left out of the output.
    study = str(REPO / "studies" / "cpu_demo.yaml")
    assert main(["plan", study, "--scaling", "weak", "--devices", "1,2", *flags]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv, name", [
    (["run", "STUDYFILE", "--storage", ""], "--storage"),
    (["status", ""], "STUDY"),
    (["report", "cpu-demo", "--out", " "], "--out"),
    (["plan", "STUDYFILE", "--storage", ""], "--storage"),
    (["landscapes", ""], "CSV"),
])
def test_an_empty_value_is_refused_naming_the_option(
        argv: list[str], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # `--storage "$URL"` with URL unset: before, the empty string read as the option left
    # out, so `run` used the study file's database (and `--out ""` the default folder).
    from tests.helpers import write_study

    study = write_study(tmp_path / "s.yaml")
    monkeypatch.chdir(tmp_path)
    argv = [str(study) if a == "STUDYFILE" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"autotune: error: {name}: got " in err and "allowed: a non-empty value" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # no database, no runs


def test_campaign_check_refuses_a_budget_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: type=int took -1, and a budget of -1 trials is always met.
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["campaign", "check", "s.yaml", "--storage", "sqlite:///x.db",
                                   "--n-trials", "-1"])
    assert exit_.value.code == 2
    assert "argument --n-trials: got -1; allowed: an integer >= 1" in capsys.readouterr().err
