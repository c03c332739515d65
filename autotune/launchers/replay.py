"""Replay launcher: answer trials from a measured landscape instead of running them.

A :class:`ReplayLauncher` holds one :class:`~autotune.landscape.LandscapeGroup` (a
published landscape, or a finished campaign's ``measurements`` table via
:func:`group_from_frame`) and, for a trial spec, writes the table's result for the spec's
layout — ``ok`` with its model TFLOPS per device and step time, or ``oom`` — through the
same result file and :class:`~autotune.trial.report.LaunchReport` as a real launcher, so
the study runner, the outcome mapping and the storage are exercised unchanged. A layout
the table does not hold cannot be replayed: :class:`~autotune.errors.LaunchError`, which
names the layout and the group (a search over a landscape must propose its layouts only).

>>> from autotune.config.cluster import ClusterConfig
>>> from autotune.config.model import MODEL_PRESETS
>>> from autotune.landscape import LandscapeGroup, Measurement
>>> from autotune.layout import Layout
>>> lay = Layout(tp=2, pp=1, dp=1, micro_batch=1, grad_accum=4)
>>> group = LandscapeGroup("g", MODEL_PRESETS["tiny"], ClusterConfig(devices_per_node=2), 4,
...                        "fp32", (Measurement(lay, "ok", 0.5, None),))
>>> ReplayLauncher(group).result_for(lay).model_tflops_per_device
0.5
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config.cluster import ClusterConfig
from autotune.config.launcher import ReplayOptions
from autotune.config.model import ModelConfig
from autotune.errors import LaunchError, SpecError
from autotune.landscape import (
    LandscapeGroup,
    Measurement,
    find_table,
    load_landscape,
    merge_duplicates,
)
from autotune.launchers.base import Launcher
from autotune.layout import Layout
from autotune.models.flops import hardware_flops_per_step, model_flops_per_step
from autotune.trial import PHASES, LaunchReport, RunConfig, TrialPaths, TrialResult, TrialSpec
from autotune.trial.measurement import median_interval
from autotune.util.atomic import write_json_atomic

if TYPE_CHECKING:
    from autotune.config._drift import DriftRule
    from autotune.config.study import TrainingConfig

__all__ = ["ReplayLauncher", "group_from_frame", "FRAME_COLUMNS", "DEFAULT_BUILD_S",
           "replay_timings", "fewest_timed_steps"]

DEFAULT_BUILD_S: float = ReplayOptions.build_s
"""``launcher.replay.build_s``'s default."""

FRAME_COLUMNS: tuple[str, ...] = ("tp", "pp", "dp", "micro_batch", "grad_accum", "zero_stage",
                                  "recompute", "status", "model_tflops_per_device")
# The model dimensions a spec must share with the group for its numbers to apply.
_MODEL_DIMS = ("n_layer", "hidden", "n_head", "seq_len", "ffn", "kv_heads")


class ReplayLauncher(Launcher):
    """Answers each trial with the landscape's measurement of its layout."""

    kind = "replay"

    def __init__(self, group: LandscapeGroup, drift: Sequence[DriftRule] = (), *,
                 build_s: float = DEFAULT_BUILD_S) -> None:
        super().__init__()
        self.group = group
        self.build_s = build_s
        """Seconds before a replayed trial's first step (``launcher.replay.build_s``)."""
        self._by_layout = {m.layout: m for m in group.measurements}
        self.drift = tuple(drift)
        """``launcher.replay.drift``: time-varying factors on step times (:meth:`factor`)."""
        self.answers = 0
        """Trials answered so far: the clock of the drift."""

    @classmethod
    def for_study(cls, opts: ReplayOptions, model: ModelConfig, cluster: ClusterConfig,
                  training: TrainingConfig, *, source: str | None = None) -> ReplayLauncher:
        """The launcher of a study file with ``launcher.kind: replay`` (``opts``: its
        ``launcher.replay``; ``source``: the study file, for relative paths and messages).

        Reads ``launcher.replay.landscape`` (relative paths: from the study file's folder
        when not found from the working directory) with the study's device, node size,
        vocabulary and attention kind, and takes group ``launcher.replay.group`` or, when
        that is not given, the one group with the study's model, world size and global
        batch. Any mismatch is a :class:`SpecError` that lists the file's groups.
        """
        path = find_table(opts.landscape, Path(source).parent if source else None)
        if not path.is_file():
            raise SpecError("launcher.replay.landscape", opts.landscape,
                            "allowed: the path of a readable landscape CSV (vTrain or Aurora "
                            "format)", source=source)
        build_s = opts.build_s
        try:
            groups = load_landscape(path, hardware=cluster.device,
                                    devices_per_node=cluster.devices_per_node,
                                    vocab_size=model.vocab_size, attention=model.attention)
        except SpecError as err:  # the file itself (not UTF-8): the study's key names it
            if err.field != "--landscape":
                raise
            raise SpecError("launcher.replay.landscape", opts.landscape, err.allowed,
                            source=source) from None
        listing = "; ".join(f"{i}: {g.name} ({len(g.measurements)} layouts)"
                            for i, g in enumerate(groups[:12]))
        listing += (f"; ... {len(groups) - 12} more: `autotune landscapes {opts.landscape}` "
                    "lists them all") if len(groups) > 12 else ""
        if opts.group is not None:
            if opts.group >= len(groups):
                raise SpecError("launcher.replay.group", opts.group,
                                f"allowed: 0..{len(groups) - 1} ({listing})", source=source)
            group = groups[opts.group]
            problem = _mismatch(group, model, cluster.world_size, training.global_batch)
            if problem:
                raise SpecError("launcher.replay.group", opts.group,
                                f"group {group.name!r} does not match the study: {problem}",
                                source=source)
            return cls(group, opts.drift, build_s=build_s)
        matching = [g for g in groups
                    if not _mismatch(g, model, cluster.world_size, training.global_batch)]
        if len(matching) != 1:
            what = ("no group of the file matches" if not matching
                    else f"{len(matching)} groups of the file match")
            closest = ("" if matching else
                       _closest(groups, model, cluster.world_size, training.global_batch))
            raise SpecError("launcher.replay.landscape", opts.landscape,
                            f"{what} the study's model, world size {cluster.world_size} "
                            f"and global batch {training.global_batch}{closest}; set "
                            f"launcher.replay.group to one of: {listing}", source=source)
        return cls(matching[0], opts.drift, build_s=build_s)

    def fixed_layouts(self) -> tuple[Layout, ...]:
        """The table's layouts: a replayed study searches exactly these."""
        return self.group.layouts()

    def result_for(self, layout: Layout, run: RunConfig | None = None, *,
                   factor: float = 1.0) -> TrialResult:
        """The table's result for ``layout``, its step time ``factor`` times slower (a drift
        factor: :meth:`factor`); :class:`LaunchError` if it has none. With ``run`` (the
        trial spec's), its wall time broken down as :func:`replay_timings`."""
        m = self._by_layout.get(layout)
        if m is None:
            raise LaunchError(f"replay: layout {layout.key()} is not in landscape "
                              f"{self.group.name!r} ({len(self._by_layout)} layouts); "
                              "a replayed search may only propose the table's layouts")
        result = _drifted(_result(m, self.group), factor)
        if run is not None:
            result.timings_s = replay_timings(run, result.step_time_s, build_s=self.build_s)
            result.elapsed_s = sum(result.timings_s.values())
        return result

    def _start(self, spec: TrialSpec, paths: TrialPaths) -> Any:
        differences = _model_differences(self.group.model, spec.model)
        if differences:
            raise LaunchError(f"replay: landscape {self.group.name!r} has another model: "
                              f"{', '.join(differences)}")
        result = self.result_for(spec.layout, spec.run, factor=self.factor(spec.layout))
        self.answers += 1
        result.write(paths.result)
        return 0

    def run(self, spec: TrialSpec, paths: TrialPaths, *, timeout_s: float) -> LaunchReport:
        """The base flow, the report charged the replayed trial's wall time
        (:func:`replay_timings`): what the budgets (``search.confirm_budget``, the tuning
        cost) weigh is what the table's trial took. The milliseconds of reading its row
        were noise a loaded machine multiplied, and the confirmation round's planned rounds
        followed them from run to run."""
        report = super().run(spec, paths, timeout_s=timeout_s)
        if report.result is not None and report.result.elapsed_s is not None:
            report = replace(report, elapsed_s=report.result.elapsed_s)
            write_json_atomic(paths.report, report.to_dict())
        return report

    def factor(self, layout: Layout) -> float:
        """The drift factor of ``layout``'s step time at the next answer: the product of
        the matching rules' ``factors[n]`` (``n`` = :attr:`answers`; the last factor after
        the list), 1 without drift.

        >>> from autotune.config._drift import DriftRule
        >>> from autotune.config.cluster import ClusterConfig
        >>> from autotune.config.model import MODEL_PRESETS
        >>> from autotune.landscape import LandscapeGroup, Measurement
        >>> lay = Layout(tp=2, pp=1, dp=1, micro_batch=1, grad_accum=4)
        >>> group = LandscapeGroup("g", MODEL_PRESETS["tiny"], ClusterConfig(
        ...     devices_per_node=2), 4, "fp32", (Measurement(lay, "ok", 0.5, None),))
        >>> r = ReplayLauncher(group, [DriftRule("*", (1.0, 2.0)), DriftRule(lay.key(), (3.0,))])
        >>> r.factor(lay), r.result_for(lay).model_tflops_per_device
        (3.0, 0.5)
        >>> r.answers = 5; r.factor(lay)
        6.0
        """
        factor, key = 1.0, layout.key()
        for rule in self.drift:
            if rule.layout in ("*", key):
                factor *= rule.factors[min(self.answers, len(rule.factors) - 1)]
        return factor

    def _poll(self, handle: Any) -> int | None:
        return int(handle)

    def _kill(self, handle: Any) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"launcher": self.kind, "landscape": self.group.name, "dtype": self.group.dtype}


def fewest_timed_steps(run: RunConfig) -> int:
    """The fewest timed steps a trial takes: ``measure_steps``, or with a precision target
    the fewest at which the median's interval exists (6 at 95%:
    :func:`autotune.trial.measurement.median_interval`), at most ``max_measure_steps``. A
    replayed trial takes exactly these (its steps are all equal: precision 0 at once)."""
    if run.measure_precision is None:
        return run.measure_steps
    return _fewest_with_interval(run.measure_steps, run.max_measure_steps, run.confidence)


@functools.lru_cache(maxsize=64)
def _fewest_with_interval(steps: int, max_steps: int | None, confidence: float) -> int:
    # Cached: the search asks it for every untried layout at every proposal (a trial's
    # expected seconds), and 64 workers' proposals spent a tenth of their CPU here.
    cap = max(steps, max_steps or steps)
    while steps < cap and median_interval([1.0] * steps, confidence) is None:
        steps += 1
    return steps


def replay_timings(run: RunConfig, step_time_s: float | None, *,
                   build_s: float) -> dict[str, float]:
    """What a replayed trial would have spent, by phase (:data:`autotune.trial.PHASES`):
    ``build_s`` before its first step (process start, imports, rendezvous and model build,
    booked as ``build``: a table records none of them apart), then ``warmup_steps`` and
    :func:`fewest_timed_steps` steps of the table's step time. A trial without a step
    time (an OOM, an error: it failed in its first step) costs ``build_s`` alone: the
    cheap failure the search weighs against a full trial (:mod:`autotune.search`)."""
    out = dict.fromkeys(PHASES, 0.0)
    out["build"] = float(build_s)
    if step_time_s is not None:
        out["warmup"] = run.warmup_steps * step_time_s
        out["measure"] = fewest_timed_steps(run) * step_time_s
    return out


def _model_differences(table: ModelConfig, asked: ModelConfig) -> list[str]:
    """The :data:`_MODEL_DIMS` in which the table's model differs from the one asked for."""
    return [f"model {dim} {getattr(table, dim)} (study: {getattr(asked, dim)})"
            for dim in _MODEL_DIMS if getattr(table, dim) != getattr(asked, dim)]


def _differences(group: LandscapeGroup, model: ModelConfig, world_size: int,
                 global_batch: int) -> list[str]:
    """Why ``group`` cannot answer a study's trials of ``model`` on ``world_size`` devices
    at ``global_batch``, one item a difference (none when it can)."""
    problems = _model_differences(group.model, model)
    if group.cluster.world_size != world_size:
        problems.append(f"{group.cluster.world_size} devices (study: {world_size})")
    if group.global_batch != global_batch:
        problems.append(f"global batch {group.global_batch} (study: {global_batch})")
    return problems


def _mismatch(group: LandscapeGroup, model: ModelConfig, world_size: int,
              global_batch: int) -> str:
    """:func:`_differences` as one phrase (empty when the group can answer the study)."""
    return ", ".join(_differences(group, model, world_size, global_batch))


def _closest(groups: list[LandscapeGroup], model: ModelConfig, world_size: int,
             global_batch: int) -> str:
    """``" (closest: group I NAME: its differences)"``: the group the study misses by the
    fewest differences (the first of ties), so that a user sees which key to change."""
    problems = [_differences(g, model, world_size, global_batch) for g in groups]
    if not problems:
        return ""
    i = min(range(len(groups)), key=lambda k: len(problems[k]))
    return f" (closest: group {i} {groups[i].name}: {', '.join(problems[i])})"


def _result(m: Measurement, group: LandscapeGroup) -> TrialResult:
    lay = m.layout
    if m.status != "ok" or m.model_tflops_per_device is None:
        what = "out of memory" if m.status == "oom" else "failed"
        return TrialResult(status="oom" if m.status == "oom" else "error",
                           error=f"{what} (replayed from landscape {group.name})",
                           world_size=lay.world_size, device="replay", layout=lay.to_dict())
    flops = model_flops_per_step(group.model, lay.global_batch)
    step_s = m.iteration_time_s
    if step_s is None:
        step_s = flops / (m.model_tflops_per_device * 1e12 * lay.world_size)
    hw = hardware_flops_per_step(group.model, lay.global_batch,
                                 recompute=lay.recompute)
    tokens = lay.global_batch * group.model.seq_len / step_s
    return TrialResult(status="ok", model_tflops_per_device=m.model_tflops_per_device,
                       hardware_tflops_per_device=m.model_tflops_per_device * hw / flops,
                       step_time_s=step_s, step_times_s=[step_s], tokens_per_s=tokens,
                       world_size=lay.world_size, device="replay", layout=lay.to_dict())


def _drifted(result: TrialResult, factor: float) -> TrialResult:
    """``result`` measured ``factor`` times slower (an ``oom`` or error is as it was)."""
    if factor == 1.0 or result.status != "ok" or result.step_time_s is None:
        return result
    return replace(result, step_time_s=result.step_time_s * factor,
                   step_times_s=[t * factor for t in result.step_times_s],
                   model_tflops_per_device=_div(result.model_tflops_per_device, factor),
                   hardware_tflops_per_device=_div(result.hardware_tflops_per_device, factor),
                   tokens_per_s=_div(result.tokens_per_s, factor))


def _div(value: float | None, factor: float) -> float | None:
    return None if value is None else value / factor


_STATUS_FROM_TABLE = {"ok": "ok", "complete": "ok", "oom": "oom", "error": "error",
                      "timeout": "error"}


def group_from_frame(df: Any, model: ModelConfig, cluster: ClusterConfig, global_batch: int,
                     dtype: str, *, name: str = "measurements") -> LandscapeGroup:
    """A landscape group from a campaign's ``measurements`` table (a pandas DataFrame).

    Needs :data:`FRAME_COLUMNS`; ``status`` is the result's (``ok``/``oom``/``error``), or
    when it is empty the ``outcome`` column's (``complete``/``oom``/``error``/``timeout``).
    Rows never judged (``infeasible``, ``interrupted``, still running) are left out, as
    are rows of another world size or global batch. A layout measured twice is merged as
    in :func:`autotune.landscape.load_landscape` (mean of its ``ok`` values).
    """
    missing = [c for c in FRAME_COLUMNS if c not in df.columns]
    if missing:
        raise SpecError("measurements table", list(df.columns),
                        f"missing column(s) {', '.join(missing)}")
    rows = []
    for i, rec in enumerate(df.to_dict("records")):
        status = _STATUS_FROM_TABLE.get(str(rec.get("status") or "").lower())
        if status is None:
            status = _STATUS_FROM_TABLE.get(str(rec.get("outcome") or "").lower())
        if status is None:
            continue
        try:
            lay = Layout(**{k: _plain(rec[k]) for k in FRAME_COLUMNS[:7]})
        except (SpecError, TypeError, ValueError) as err:
            raise SpecError(f"measurements row {i}", rec.get("tp"), f"bad layout ({err})") \
                from None
        if lay.world_size != cluster.world_size or lay.global_batch != global_batch:
            continue
        value = rec.get("model_tflops_per_device")
        value = float(value) if value is not None and math.isfinite(float(value)) else None
        if status == "ok" and value is None:
            status = "error"
        step = rec.get("step_time_s")
        step = float(step) if step is not None and math.isfinite(float(step)) else None
        rows.append(Measurement(lay, status, value if status == "ok" else None, step))
    return LandscapeGroup(name=name, model=model, cluster=cluster, global_batch=global_batch,
                          dtype=dtype, measurements=merge_duplicates(rows))


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones (Layout refuses anything but int/str)."""
    return value.item() if hasattr(value, "item") else value
