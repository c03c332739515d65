"""``autotune profile``: which shapes it measures, how it runs them, what it writes.

The fast tests drive :func:`autotune.profiling.layers.run_profile` with a launcher that answers
from a known linear step-time model (so the fitted layer times can be checked exactly,
and one shape can be made to run out of memory); the slow test runs the real trainer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.landscape import shipped_landscape
from autotune.launchers.base import Launcher
from autotune.models.profile import LayerProfile, load_profile
from autotune.profiling.layers import (
    ProfileCell,
    compare_rows,
    profile_cells,
    profile_specs,
    render_memory_comparison,
    run_profile,
)
from autotune.spec import load_study
from autotune.trial import TrialPaths, TrialResult, TrialSpec
from tests.helpers import run_cli, write_study

VTRAIN = shipped_landscape("vtrain_a100_single_node.csv")


def layer_time(tp: int, mb: int) -> float:
    return 1e-3 * mb / tp + 2e-4


def layer_bytes(tp: int, mb: int) -> int:
    return 2_000_000 * mb // tp + 3_000_000


class LinearLauncher(Launcher):
    """Step time ``m L t + o L + c m + k`` with a known ``t`` per shape and a peak of
    ``L b + c' m + k'`` with a known ``b``; ``oom_tp`` runs out of memory. Writes the
    trainer's result file like the real one."""

    kind = "linear"

    def __init__(self, oom_tp: int | None = None, *, crash_at: int | None = None,
                 interrupt_at: int | None = None) -> None:
        super().__init__()
        self.oom_tp = oom_tp
        self.crash_at = crash_at
        """The run (1-based) that crashes without a result."""
        self.interrupt_at = interrupt_at
        """The run during which Ctrl-C arrives (the real launchers kill the trial)."""
        self.specs: list[TrialSpec] = []

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        if len(self.specs) + 1 == self.interrupt_at:
            raise KeyboardInterrupt
        self.specs.append(spec)
        lay, n_layer = spec.layout, spec.model.n_layer
        if lay.tp == self.oom_tp:
            TrialResult(status="oom", error="CUDA out of memory").write(paths.result)
            return None
        if len(self.specs) == self.crash_at:
            TrialResult(status="error", error="segfault").write(paths.result)
            return None
        step = (lay.grad_accum * n_layer * layer_time(lay.tp, lay.micro_batch)
                + 3e-4 * n_layer + 5e-4 * lay.grad_accum + 2e-3)
        peak = n_layer * layer_bytes(lay.tp, lay.micro_batch) + 100_000 * lay.grad_accum + 4e8
        TrialResult(status="ok", model_tflops_per_device=1.0, step_time_s=step,
                    world_size=lay.world_size, device="cpu",
                    peak_memory_bytes=int(peak)).write(paths.result)
        return None

    def _poll(self, handle: Any) -> int | None:
        return 0

    def _kill(self, handle: Any) -> None:
        pass


@pytest.fixture
def study(tmp_path: Path) -> Path:
    return write_study(tmp_path / "s.yaml", devices=2)


def test_cells_are_the_feasible_shapes_best_predicted_first(study: Path) -> None:
    spec = load_study(study)
    cells, skipped = profile_cells(spec)
    assert len(cells) == len(set(cells)) and not skipped
    from autotune.feasibility import Constraints
    from autotune.planning.candidates import rank_candidates

    constraints = Constraints.from_configs(spec.cluster, spec.training, spec.search,
                                           spec.trial)
    ranked = rank_candidates(spec.model, spec.cluster, spec.training, spec.search,
                             constraints, profile=spec.profile)
    shapes = {ProfileCell(c.layout.tp, c.layout.micro_batch, c.layout.recompute)
              for c in ranked}
    assert set(cells) == shapes
    first = ranked[0].layout
    assert cells[0] == ProfileCell(first.tp, first.micro_batch, first.recompute)
    top1, _ = profile_cells(spec, top=1)
    assert top1 == cells[:1]


def test_tp_across_nodes_is_not_profiled(tmp_path: Path) -> None:
    path = write_study(tmp_path / "s.yaml", devices=1,
                       cluster={"nodes": 2, "devices_per_node": 1, "device": "cpu"},
                       search={"tp": [1, 2], "pp": [1], "micro_batch": [1],
                               "zero_stage": [0], "recompute": ["none"],
                               "tp_across_nodes": True, "n_trials": 2})
    cells, skipped = profile_cells(load_study(path))
    assert cells == [ProfileCell(1, 1, "none")]
    assert [c for c, _ in skipped] == [ProfileCell(2, 1, "none")]
    assert "spans nodes" in skipped[0][1]


def test_specs_are_the_two_by_two_design_on_tp_devices(study: Path) -> None:
    spec = load_study(study)
    specs = profile_specs(spec, ProfileCell(2, 4, "none"))
    assert sorted((s.model.n_layer, s.layout.grad_accum) for s in specs) == [
        (1, 1), (1, 2), (3, 1), (3, 2)]
    for s in specs:
        lay = s.layout
        assert (lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.zero_stage) == (2, 1, 1, 4, 0)
        assert s.model.hidden == spec.model.hidden and s.run == spec.run_config()


def test_run_profile_recovers_the_layer_times_and_survives_an_oom(study: Path) -> None:
    spec = load_study(study)
    cells = [ProfileCell(1, 2, "none"), ProfileCell(2, 2, "none")]
    lines: list[str] = []
    launcher = LinearLauncher(oom_tp=2)
    out = run_profile(spec, launcher, cells, log=lines.append)
    assert set(out.failed) == {cells[1]} and out.failed[cells[1]].startswith("oom")
    # The OOM shape was given up after its first run; the other got its 4.
    assert len(launcher.specs) == 5
    assert len(out.profile) == 1
    got = out.profile.entries[0]
    assert (got.shape.tp, got.shape.micro_batch) == (1, 2)
    assert got.layer_time_s == pytest.approx(layer_time(1, 2), rel=1e-9)
    assert any("OOM" in line and "analytic" in line for line in lines)
    assert all("[" in line for line in lines)  # numbered progress lines


def test_run_profile_measures_the_layer_bytes_and_compares_them(study: Path) -> None:
    """The peaks of the 2 x 2 runs give the layer's bytes (exactly here: no interaction),
    marked as a resident set (a CPU result); the comparison splits them into the analytic
    states and the measured activations, beside the analytic bytes."""
    from autotune.models import memory as mem

    spec = load_study(study)
    cell = ProfileCell(1, 2, "none")
    out = run_profile(spec, LinearLauncher(), [cell])
    [entry] = out.profile.entries
    assert entry.memory is not None and entry.memory.peak == "rss"
    assert entry.memory.layer_bytes == pytest.approx(layer_bytes(1, 2), abs=1e-3)
    assert entry.memory.stderr_bytes == pytest.approx(0.0, abs=1e-3)
    [row] = compare_rows(spec, out.profile, [cell])
    lay = cell.layout()
    states = mem.layer_state_bytes(spec.model, lay, "fp32")
    assert row.memory is not None and row.memory.state_bytes == states
    assert row.memory.activation_bytes == pytest.approx(
        layer_bytes(1, 2) / mem.CPU_ALLOCATOR_OVERHEAD - states, rel=1e-9)
    analytic = mem.stored_layer_bytes(spec.model, lay, "fp32")
    assert row.analytic_activation_bytes == analytic
    assert row.analytic_layer_bytes == pytest.approx(
        mem.CPU_ALLOCATOR_OVERHEAD * (states + analytic), rel=1e-12)
    table = render_memory_comparison([row])
    assert cell.label() in table and "rss" in table and "activations MiB" in table
    assert render_memory_comparison([row._replace(memory=None)]) == ""


def test_a_shape_whose_last_run_fails_is_not_fitted_from_the_rest(study: Path) -> None:
    """Three of four runs would still fit (one series per accumulation) but include the
    optimizer's share in the layer: an incomplete design is no measurement."""
    spec = load_study(study)
    cells = [ProfileCell(1, 2, "none"), ProfileCell(2, 2, "none")]
    saved: list[LayerProfile] = []
    out = run_profile(spec, LinearLauncher(crash_at=8), cells, checkpoint=saved.append)
    assert set(out.failed) == {cells[1]} and out.failed[cells[1]].startswith("error")
    assert [e.shape.tp for e in out.profile.entries] == [1]
    assert [len(p) for p in saved] == [1]  # checkpointed after the shape that finished


def test_ctrl_c_keeps_the_finished_shapes_only(study: Path) -> None:
    spec = load_study(study)
    cells = [ProfileCell(1, 2, "none"), ProfileCell(2, 2, "none"), ProfileCell(1, 4, "none")]
    out = run_profile(spec, LinearLauncher(interrupt_at=7), cells)
    assert out.interrupted
    assert [e.shape.tp for e in out.profile.entries] == [1]
    assert out.profile.entries[0].layer_time_s == pytest.approx(layer_time(1, 2), rel=1e-9)
    assert out.failed == {cells[1]: "interrupted", cells[2]: "not run (interrupted)"}


def test_a_missing_study_profile_is_where_profile_writes(tmp_path: Path) -> None:
    """``cluster.profile`` may name a file that does not exist yet: ``autotune profile``
    reads the study without it and writes there by default; other commands refuse it."""
    study = write_study(tmp_path / "s.yaml", devices=2,
                        cluster={"nodes": 1, "devices_per_node": 2, "device": "cpu",
                                 "profile": "prof/tiny.json"})
    spec = load_study(study, read_profile=False)
    assert spec.profile is None
    assert spec.cluster.profile_path == tmp_path / "prof" / "tiny.json"
    assert main(["plan", str(study)]) == 2


def _cli(*args: str) -> int:
    return main(["profile", *args])


def test_cli_refuses_bad_requests(study: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli() == 2
    assert "exactly one" in capsys.readouterr().err
    assert _cli(str(study), "--from-landscape", str(VTRAIN)) == 2
    assert _cli("--from-landscape", str(VTRAIN)) == 2
    assert "--out" in capsys.readouterr().err
    assert _cli("--from-landscape", str(VTRAIN), "--out", str(tmp_path / "p.json"),
                "--top", "2") == 2
    assert _cli(str(study), "--attention", "flash") == 2
    assert "only with --from-landscape" in capsys.readouterr().err
    assert _cli("--from-landscape", str(VTRAIN), "--out", str(tmp_path / "p.json"),
                "--hardware", "nope") == 2
    assert "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        _cli(str(study), "--layers", "2")
    assert exit_.value.code == 2
    assert "--layers" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert _cli(str(study), "--out", str(blocker / "p.json")) == 2
    assert "--out" in capsys.readouterr().err
    assert _cli(str(study), "--out", str(tmp_path)) == 2
    assert "directory" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    # An unreadable output file is refused before anything runs.
    assert _cli(str(study), "--out", str(bad)) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err
    assert not (tmp_path / "runs").exists()


def test_the_default_output_is_read_before_any_run(study: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Without --out the file is profiles/<study>.json: an existing one is extended, so a
    corrupt one is refused before a run is spent (and is not replaced)."""
    monkeypatch.chdir(tmp_path)
    default = tmp_path / "profiles" / "t.json"
    default.parent.mkdir()
    default.write_text('{"kind": "something else"}')
    assert _cli(str(study)) == 2
    assert "kind" in capsys.readouterr().err
    assert default.read_text() == '{"kind": "something else"}'
    assert not (tmp_path / "runs").exists()


def test_cli_refuses_a_replay_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path / "r.yaml", devices=8,
                       model={"preset": "gpt-1.3b"},
                       launcher={"kind": "replay", "replay": {"landscape": str(VTRAIN)}})
    assert _cli(str(path)) == 2
    assert "launcher.kind" in capsys.readouterr().err


def test_from_landscape_writes_and_merges(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "vtrain.json"
    assert _cli("--from-landscape", str(VTRAIN), "--out", str(out)) == 0
    prof = load_profile(out)
    assert len(prof) > 10 and {e.shape.device for e in prof.entries} == {"a100-80gb"}
    assert json.loads(out.read_text())["kind"] == "autotune-layer-profile"
    assert "layer shape(s)" in capsys.readouterr().out
    # Merging keeps what the file had: a second write of the same table changes nothing
    # (named this time as a shipped table, by its name alone, as `autotune landscapes` takes).
    assert _cli("--from-landscape", VTRAIN.name, "--out", str(out)) == 0
    assert load_profile(out) == LayerProfile(prof.entries, source=load_profile(out).source)


MEMORY_TOLERANCE = 0.25
"""Accepted relative error of the analytic bytes per layer against the measured slope of
the peak resident set (as ``tests/models/test_memory_vs_trainer.py`` accepts for peaks)."""


@pytest.mark.slow
@pytest.mark.alone  # fits a slope across 4 launches: another test's load skews one of them
def test_profile_a_tiny_study_for_real_then_plan_uses_it(tmp_path: Path) -> None:
    """The study names its profile before it exists; ``autotune profile`` (real trainer
    runs) writes it there, and ``plan`` then ranks with it."""
    # The fit reads the layer time from the 2 x 2 design's interaction contrast (one more
    # micro-batch through two more layers), so the layer must stand well above the noise of
    # a busy 2-core machine: a 128-wide layer over 64 tokens (about 4 ms a micro-batch) gave
    # a contrast of -0.1 ms in CI; 256 wide over 128 tokens is about 8x the work.
    study = write_study(tmp_path / "s.yaml", devices=2,
                        model={"n_layer": 2, "hidden": 256, "n_head": 4, "seq_len": 128,
                               "vocab_size": 64, "ffn_hidden": 1024, "name": "narrow"},
                        cluster={"nodes": 1, "devices_per_node": 2, "device": "cpu",
                                 "profile": "prof/tiny.json"},
                        trial={"warmup_steps": 1, "measure_steps": 5, "timeout_s": 120,
                               "device": "cpu"})
    (tmp_path / "elsewhere").mkdir()
    run = run_cli("profile", str(study), "--top", "1", cwd=tmp_path / "elsewhere")
    print(run.stdout)
    assert run.returncode == 0, run.stderr
    assert "[4/4]" in run.stderr and "measured ms/layer" in run.stdout
    assert "measured MiB/layer" in run.stdout
    prof = load_profile(tmp_path / "prof" / "tiny.json")
    assert len(prof) == 1 and prof.entries[0].layer_time_s > 0
    # The layer's bytes from the peak RSS of the same four runs: positive, and within
    # MEMORY_TOLERANCE of the analytic states + activations (with the CPU retention).
    spec = load_study(study)
    [row] = compare_rows(spec, prof, profile_cells(spec, top=1)[0])
    assert row.entry.memory is not None and row.memory is not None
    assert row.entry.memory.peak == "rss" and row.entry.memory.layer_bytes > 0
    ratio = row.entry.memory.layer_bytes / row.analytic_layer_bytes
    assert abs(ratio - 1) <= MEMORY_TOLERANCE, ratio
    plan = run_cli("plan", str(study), "--format", "json", cwd=tmp_path / "elsewhere")
    assert plan.returncode == 0, plan.stderr
    rows = json.loads(plan.stdout)["feasible"]
    assert any(r["step"]["profiled"] for r in rows)
    assert any(r["memory"]["profiled"] for r in rows) == row.memory.usable
