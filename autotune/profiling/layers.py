"""``autotune profile``: measure the layer times of a study's layouts on the real stack.

For each distinct layer shape among the study's feasible layouts (TP degree, micro-batch,
recompute; the model, device and dtype are the study's), the built-in trainer runs on
``tp`` devices with ``pp = dp = 1`` and ZeRO 0, at each of the ``--layers`` counts times
gradient accumulation 1 and 2 (with the default two layer counts, a 2 x 2 design:
:func:`autotune.models.profile_fit.fit_layer_profile` then separates the layer's time per
micro-batch from the optimizer step's per-layer share and from the per-micro-batch work
outside the layers). Each run is a short trial through the study's own launcher (local or
SLURM), with its warm-up, measured steps and timeout.

A run that fails (out of memory, a timeout, a crash) costs its shape: the shape's other
runs are skipped, none of its measurements is used (an incomplete design would fit the
optimizer's share into the layer), and the cost model keeps the analytic time for it. The
other shapes are still measured. After every completed shape the caller's ``checkpoint``
gets the profile so far, so that a job killed at its time limit keeps what it finished.
Cost: ``len(layers) x 2`` short runs per shape on at most one node's devices each,
against the study's trials on the whole machine.

The same runs measure memory: each result's peak (the allocator's peak allocated bytes on
GPU/XPU, the peak resident set on CPU) at two layer counts gives the layer's bytes
(:func:`~autotune.models.profile_fit.fit_layer_profile`), which the memory model splits
into its analytic model states and measured activations
(:func:`~autotune.models.memory.measured_layer_activation`). :func:`compare_rows` puts
both beside the analytic figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.errors import SpecError
from autotune.feasibility import Constraints
from autotune.launchers.base import Launcher
from autotune.layout import Layout, Recompute
from autotune.models.links import tp_link
from autotune.models.memory import (
    MeasuredActivation,
    layer_state_bytes,
    measured_layer_activation,
    peak_retention,
    stored_layer_bytes,
)
from autotune.models.profile import LayerProfile, LayerShape, ProfileEntry
from autotune.models.profile_blend import analytic_layer
from autotune.models.profile_fit import LayerSample, fit_layer_profile, median_standard_error
from autotune.planning.candidates import rank_candidates
from autotune.spec import StudySpec
from autotune.trial import TrialPaths, TrialSpec
from autotune.trial.classify import classify
from autotune.util.text import format_duration, format_table

__all__ = ["ProfileCell", "ProfileRun", "Comparison", "check_profilable", "profile_cells",
           "profile_specs", "run_profile", "compare_rows", "render_comparison",
           "render_memory_comparison", "DEFAULT_LAYERS", "DEFAULT_ACCUMS"]

DEFAULT_LAYERS = (1, 3)
"""Layer counts of the runs: few layers keep each run short and small; a gap of two
doubles the layer's signal against the run-to-run noise (against 1 and 2)."""
DEFAULT_ACCUMS = (1, 2)
"""Micro-batches per step of the runs (the second factor of the design)."""


@dataclass(frozen=True, order=True)
class ProfileCell:
    """One layer shape to measure, as the study's layouts name it."""

    tp: int
    micro_batch: int
    recompute: Recompute

    def label(self) -> str:
        return f"tp{self.tp}-mb{self.micro_batch}-{self.recompute}"

    def layout(self, grad_accum: int = 1) -> Layout:
        """The layout that measures it: the TP group alone, no pipeline, no replicas."""
        return Layout(tp=self.tp, pp=1, dp=1, micro_batch=self.micro_batch,
                      grad_accum=grad_accum, zero_stage=0, recompute=self.recompute)

    def shape(self, model: ModelConfig, cluster: ClusterConfig, dtype: str) -> LayerShape:
        """The profile key of this cell's layer of ``model`` on ``cluster`` in ``dtype``."""
        lay = self.layout()
        return LayerShape.of(model, lay, device=cluster.device, dtype=dtype,
                             tp_link=tp_link(lay, cluster))


@dataclass
class ProfileRun:
    """What a profiling pass measured and what it could not."""

    profile: LayerProfile
    failed: dict[ProfileCell, str] = field(default_factory=dict)
    """Shapes without a layer time, and why."""
    interrupted: bool = False


def check_profilable(spec: StudySpec) -> None:
    """Refuse a study whose launcher cannot run the trainer (a replayed table)."""
    if spec.launcher.kind == "replay":
        raise SpecError("launcher.kind", "replay", "allowed: local or slurm (a replayed "
                        "table is profiled with --from-landscape CSV)")


def profile_cells(spec: StudySpec, *, top: int | None = None,
                  ) -> tuple[list[ProfileCell], list[tuple[ProfileCell, str]]]:
    """The shapes to measure: those of the feasible layouts (of the ``top`` best predicted
    ones, if given), best predicted first; and the shapes left out, with the reason."""
    constraints = Constraints.from_configs(spec.cluster, spec.training, spec.search,
                                           spec.trial, profile=spec.profile)
    ranked = rank_candidates(spec.model, spec.cluster, spec.training, spec.search,
                             constraints, profile=spec.profile)
    if top is not None:
        ranked = ranked[:top]
    cells: list[ProfileCell] = []
    skipped: list[tuple[ProfileCell, str]] = []
    for cand in ranked:
        lay = cand.layout
        cell = ProfileCell(lay.tp, lay.micro_batch, lay.recompute)
        if cell in cells or any(c == cell for c, _ in skipped):
            continue
        if lay.tp > spec.cluster.devices_per_node:
            # One profiling run places its TP group on one node; a group that spans nodes
            # talks over another link, which such a run cannot reproduce.
            skipped.append((cell, f"TP {lay.tp} spans nodes of "
                                  f"{spec.cluster.devices_per_node} devices"))
            continue
        cells.append(cell)
    return cells, skipped


def profile_specs(spec: StudySpec, cell: ProfileCell, *,
                  layers: Sequence[int] = DEFAULT_LAYERS,
                  accums: Sequence[int] = DEFAULT_ACCUMS) -> list[TrialSpec]:
    """The trainer runs that measure ``cell``: every layer count times every accumulation."""
    run = spec.run_config()
    return [TrialSpec(model=replace(spec.model, n_layer=n_layer), layout=cell.layout(m),
                      run=run)
            for n_layer in layers for m in accums]


def _paths(spec: StudySpec, trial: TrialSpec) -> TrialPaths:
    name = f"{trial.layout.key()}-L{trial.model.n_layer}"
    return TrialPaths(Path(spec.launcher.run_dir) / spec.name / "profile" / name)


def run_profile(spec: StudySpec, launcher: Launcher, cells: Sequence[ProfileCell], *,
                layers: Sequence[int] = DEFAULT_LAYERS, accums: Sequence[int] = DEFAULT_ACCUMS,
                log: Callable[[str], None] = lambda _line: None,
                checkpoint: Callable[[LayerProfile], object] | None = None) -> ProfileRun:
    """Measure ``cells`` with ``launcher`` and fit their layer times.

    Only shapes whose every run succeeded are fitted. A Ctrl-C stops after the running
    trial has been killed (the launcher does that) and returns the shapes finished so
    far, with ``interrupted`` set.
    """
    model, cluster = spec.model, spec.cluster
    device, dtype = cluster.device, spec.training.dtype
    source = f"autotune profile {spec.source or spec.name}"
    out = ProfileRun(LayerProfile(source=source))
    n_runs = len(cells) * len(layers) * len(accums)
    started, i = time.monotonic(), 0
    for cell in cells:
        samples: list[LayerSample] = []
        for trial in profile_specs(spec, cell, layers=layers, accums=accums):
            i += 1
            what = (f"[{i}/{n_runs}] {cell.label()}, {trial.model.n_layer} layer(s) x "
                    f"{trial.layout.grad_accum} micro-batch(es) on "
                    f"{trial.layout.world_size} device(s)")
            t0 = time.monotonic()
            try:
                report = launcher.run(trial, _paths(spec, trial),
                                      timeout_s=spec.trial.timeout_s)
            except KeyboardInterrupt:
                out.interrupted = True
                out.failed[cell] = "interrupted"
                log(f"{what}: interrupted")
                break
            outcome = classify(report, launcher.workload.oom_signatures)
            res = report.result
            if outcome.kind != "complete" or res is None or not res.step_time_s:
                first = outcome.reason.strip().splitlines()[0][:160] if outcome.reason else ""
                out.failed[cell] = f"{outcome.kind}: {first}".rstrip(": ")
                log(f"{what}: {outcome.kind.upper()} {first}; this shape keeps the "
                    "analytic time")
                break
            # The trainer's peak: max allocated over ranks on GPU/XPU, peak RSS on CPU.
            samples.append(LayerSample(trial.model, trial.layout, device, dtype,
                                       tp_link(trial.layout, cluster), res.step_time_s,
                                       median_standard_error(res.step_times_s),
                                       peak_memory_bytes=res.peak_memory_bytes,
                                       memory_peak="rss" if res.device == "cpu"
                                       else "allocated"))
            elapsed = time.monotonic() - started
            peak = (f", peak {res.peak_memory_bytes / MiB:.5g} MiB"
                    if res.peak_memory_bytes else "")
            log(f"{what}: {res.step_time_s * 1e3:.4g} ms/step{peak} in "
                f"{format_duration(time.monotonic() - t0)}; elapsed "
                f"{format_duration(elapsed)}, ETA {format_duration(elapsed / i * (n_runs - i))}")
        if out.interrupted:
            break
        if cell in out.failed:
            continue
        # Shapes never share a series, so each is fitted on its own samples alone.
        out.profile = out.profile.merged(fit_layer_profile(samples, source=source))
        if out.profile.entry(cell.shape(model, cluster, dtype)) is None:
            out.failed[cell] = "no positive slope: the layer is too small against the noise"
        elif checkpoint is not None:
            checkpoint(out.profile)
    for cell in cells:
        if cell not in out.failed and out.profile.entry(cell.shape(model, cluster, dtype)) is None:
            out.failed[cell] = "not run (interrupted)"
    return out


MiB = 2**20


class Comparison(NamedTuple):
    """One measured shape beside the analytic models."""

    cell: ProfileCell
    entry: ProfileEntry
    analytic_s: float
    """The analytic layer time."""
    memory: MeasuredActivation | None
    """The measured bytes split into analytic states and measured activations (``None``:
    the entry has no memory)."""
    analytic_layer_bytes: float
    """The analytic bytes of one layer at the profile runs' layout, in the measured
    peak's terms: ``rho (S + A)`` (states, stored activations, allocator retention)."""
    analytic_activation_bytes: int
    """The analytic stored activations of one layer and micro-batch (live bytes)."""


def compare_rows(spec: StudySpec, profile: LayerProfile, cells: Sequence[ProfileCell],
                 ) -> list[Comparison]:
    """Per measured cell, its entry beside the analytic layer time and layer bytes: how far
    the analytic models are off."""
    rows = []
    model, cluster, dtype = spec.model, spec.cluster, spec.training.dtype
    for cell in cells:
        entry = profile.entry(cell.shape(model, cluster, dtype))
        if entry is None:
            continue
        lay = cell.layout()
        analytic = analytic_layer(model, lay, cluster, dtype).total_s
        measured = measured_layer_activation(model, lay, dtype=dtype, device=cluster.device,
                                             profile=profile)
        rho = peak_retention(entry.memory.peak) if entry.memory else 1.0
        act = stored_layer_bytes(model, lay, dtype)
        rows.append(Comparison(cell, entry, analytic, measured,
                               rho * (layer_state_bytes(model, lay, dtype) + act), act))
    return rows


def render_comparison(rows: Sequence[Comparison]) -> str:
    """The measured layer times beside the analytic ones, as an aligned table."""
    return format_table(
        ["shape", "measured ms/layer", "+-", "analytic ms", "measured/analytic"],
        [[r.cell.label(), f"{r.entry.layer_time_s * 1e3:.4g}",
          f"{r.entry.stderr_s * 1e3:.2g}" if r.entry.stderr_s is not None else "",
          f"{r.analytic_s * 1e3:.4g}", f"{r.entry.layer_time_s / r.analytic_s:.2f}"]
         for r in rows])


def render_memory_comparison(rows: Sequence[Comparison]) -> str:
    """The measured bytes per layer beside the analytic ones, and the activations they
    give (measured less the analytic states), as an aligned table; ``""`` when no row has
    memory. A non-positive activation figure (the analytic states exceed the measurement)
    is marked: the memory model does not use it."""
    body = []
    for r in rows:
        mem, split = r.entry.memory, r.memory
        if mem is None or split is None:
            continue
        body.append([
            r.cell.label(), mem.peak, f"{mem.layer_bytes / MiB:.4g}",
            f"{mem.stderr_bytes / MiB:.2g}" if mem.stderr_bytes is not None else "",
            f"{r.analytic_layer_bytes / MiB:.4g}",
            f"{mem.layer_bytes / r.analytic_layer_bytes:.2f}",
            f"{split.activation_bytes / MiB:.4g}" + ("" if split.usable else " (unused)"),
            f"{r.analytic_activation_bytes / MiB:.4g}"])
    if not body:
        return ""
    return format_table(
        ["shape", "peak", "measured MiB/layer", "+-", "analytic MiB/layer",
         "measured/analytic", "activations MiB", "analytic act. MiB"], body)
