"""``autotune report STUDY``: one study's report, plots and data exports in a directory.

:func:`study_report` reads the study's trials and its ``measurements`` rows into frames
(:mod:`~autotune.report.frames`), computes each section (:mod:`~autotune.report.analysis`),
draws its plot (:mod:`~autotune.report.plots`), and writes the report, plots and exports
atomically (:mod:`~autotune.report.files`). What each section shows and how to read it:
``docs/reports.md``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import optuna
import pandas as pd

from autotune.layout import Layout
from autotune.report import analysis as an
from autotune.report import plots
from autotune.report.energy import energy_section
from autotune.report.export import megatron_deepspeed_args
from autotune.report.files import ReportPaths, write_text_atomic
from autotune.report.frames import measurements_frame, trials_frame, write_exports
from autotune.report.render import Code, Image, Report, Section, Table, Text, render
from autotune.report.results import confirmation_line, selected_trial
from autotune.report.timings import breakdown_line, time_breakdown
from autotune.storage import (
    ConfirmationCost,
    Storage,
    StudyAttr,
    TrialAttr,
    confirmation_cost,
    learned_from_line,
    learned_from_of,
    study_device_memory_gib,
    study_fingerprint,
    trial_layout_key,
)
from autotune.trial import PHASES

__all__ = ["study_report"]

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def study_report(storage: Storage, study: optuna.Study, out_dir: Path, *, fmt: str = "md",
                 memory_gib: float | None = None, log: Log = _quiet) -> Path:
    """Write the report of ``study`` under ``out_dir``; return the report file's path.

    ``memory_gib`` overrides the device memory drawn in the memory plot; by default it is
    the study's ``device_memory_gib`` user attribute where the runner stored one (it
    includes the study file's ``cluster.memory_gb``), else the hardware table's figure.
    """
    paths = ReportPaths(out_dir)
    log(f"report of study {study.study_name!r} from {storage.masked_url}")
    trials = trials_frame(study)
    meas = measurements_frame(storage.engine, study_name=study.study_name)
    log(f"read {len(trials)} trials and {len(meas)} measurement rows")
    device = (str(meas["device_type"].iloc[0]) if len(meas)
              else study_fingerprint(study).get("device"))
    if memory_gib is None:
        memory_gib = study_device_memory_gib(study)
    ctx = _Context(paths, log)
    report = Report(
        title=f"autotune report: {study.study_name}",
        meta=_meta(study, storage, trials, device),
        sections=[
            _best(study, trials),
            _heatmap(ctx, trials),
            _microbatch(ctx, trials),
            _memory(ctx, trials, an.device_memory_gib(device, memory_gib), device),
            _outcomes(ctx, trials),
            _cost(ctx, meas, confirmation_cost(storage, study.study_name)),
            _time(study),
            energy_section(meas),
            _importance(ctx, study),
        ])
    exported = write_exports({"trials": trials, "measurements": meas}, paths.data)
    for p in exported:
        log(f"wrote {p}")
    report.sections.append(Section("Data", [
        Text("The frames behind this report, for pandas, a spreadsheet or your own plots. "
             "trials: one row per Optuna trial; measurements: one row per trial "
             "execution (the measurements table of the database)."),
        Table(pd.DataFrame({"file": [paths.relative(p) for p in exported],
                            "rows": [len(trials) if "trials" in p.name else len(meas)
                                     for p in exported]}))]))
    target = paths.report(fmt)
    write_text_atomic(target, render(report, fmt))
    log(f"wrote {target}")
    return target


class _Context:
    """Where plots go and how progress is told, for the section builders."""

    def __init__(self, paths: ReportPaths, log: Log) -> None:
        self.paths, self.log = paths, log

    def image(self, name: str, alt: str, draw: Callable[[Path], None]) -> Image:
        target = self.paths.plot(name)
        draw(target)
        self.log(f"wrote {target}")
        return Image(self.paths.relative(target), alt)


def _meta(study: optuna.Study, storage: Storage, trials: pd.DataFrame,
          device: str | None) -> list[str]:
    fp, attrs = study_fingerprint(study), study.user_attrs
    model = attrs.get(StudyAttr.MODEL) or fp.get("model", {}).get("name", "?")
    lines = [f"model: {model}; cluster: {attrs.get(StudyAttr.CLUSTER, device or '?')}; "
             f"global batch {fp.get('global_batch', '?')}; dtype {fp.get('dtype', '?')}",
             f"objective: {attrs.get(StudyAttr.OBJECTIVE, 'model TFLOPS per device')}",
             f"storage: {storage.masked_url}",
             f"trials: {len(trials)} ("
             + ", ".join(f"{n} {o}" for o, n in an.outcome_counts(trials).itertuples(index=False))
             + ")",
             f"generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"]
    learned = learned_from_line(learned_from_of(study))
    if learned:
        lines.insert(-1, f"calibration: {learned}")
    return lines


def _best(study: optuna.Study, trials: pd.DataFrame) -> Section:
    s = Section("Best layouts")
    top = an.best_layouts(trials)
    if top.empty:
        s.blocks.append(Text("No trial has completed yet: nothing to rank."))
        return s
    b = top.iloc[0]
    s.blocks.append(Text(
        f"Best: {b['layout']} at {b['model_tflops_per_device']:.4g} model TFLOPS per device "
        f"(trial #{b['trial']}). The table ranks the complete trials by measured model TFLOPS "
        "per device; predicted columns are the cost and memory models' estimates."))
    confirmed = confirmation_line(study)
    s.blocks.append(Text(
        f"Confirmation round (the top layouts measured again side by side, interleaved; "
        f"the interval of the per-round ratio best / runner-up): {confirmed}."
        if confirmed else "Confirmation round: none ran (search.confirm off, or the study "
        "is not done)."))
    s.blocks.append(Table(top[["rank", "trial", "layout", "model_tflops_per_device",
                               "predicted_tflops_per_device", "step_time_s",
                               "peak_memory_gib", "predicted_memory_gib"]].rename(columns={
        "model_tflops_per_device": "TFLOPS/device", "predicted_tflops_per_device":
        "predicted TFLOPS/device", "step_time_s": "step (s)", "peak_memory_gib":
        "peak memory (GiB)", "predicted_memory_gib": "predicted memory (GiB)"}),
        "layout key: tp-pp-dp-micro batch-grad accum-ZeRO stage-recompute"))
    fp = study_fingerprint(study)
    chosen = selected_trial(study)  # the confirmation round's winner where it ran
    chosen_key = trial_layout_key(chosen) if chosen is not None else None
    lay = Layout.from_key(chosen_key or b["layout"])
    args = megatron_deepspeed_args(lay, dtype=fp.get("dtype", "bf16"), model=fp.get("model"),
                                   device=fp.get("device"))
    s.blocks += [Text("Megatron-DeepSpeed arguments for the best layout (also: autotune best "
                      "STUDY --emit megatron-deepspeed, or --emit deepspeed for ds_config.json):"),
                 Code(shlex.join(args))]
    return s


def _heatmap(ctx: _Context, trials: pd.DataFrame) -> Section:
    s = Section("TFLOPS by tensor and pipeline parallelism")
    tried = an.judged(trials)
    if tried.empty:
        s.blocks.append(Text("No trial has been judged yet."))
        return s
    best, what = an.tp_pp_grid(trials)
    s.blocks.append(Text(
        "Each cell: the best model TFLOPS per device measured with that (tp, pp), over all "
        "micro-batch sizes, ZeRO stages and recompute settings tried, trials stopped early "
        "included (marked: their measurement ended at the point it was sure to be below the "
        "best). A cell without a number names the commonest outcome of its trials (OOM, "
        "infeasible, failed)."))
    s.blocks.append(ctx.image("tp_pp_heatmap", "best TFLOPS per device by tp and pp",
                              lambda p: plots.tp_pp_heatmap(best, what, p)))
    return s


def _microbatch(ctx: _Context, trials: pd.DataFrame) -> Section:
    s = Section("Micro-batch size and gradient accumulation (the bubble)")
    done = an.microbatch_frame(trials)
    if done.empty:
        s.blocks.append(Text("No trial has completed yet."))
        return s
    s.blocks.append(Text(
        "At a fixed global batch, a larger micro-batch means fewer gradient-accumulation "
        "steps (ga = global batch / (dp x micro-batch)). Larger micro-batches use the device "
        "better, but with pipeline parallelism fewer micro-batches leave a larger idle "
        "bubble, (pp - 1) / ga of the step (Narayanan et al. 2021, section 2.2.1)."))
    s.blocks.append(ctx.image("microbatch", "TFLOPS vs micro-batch size and bubble fraction",
                              lambda p: plots.microbatch_effect(done, p)))
    s.blocks.append(Table(done[["number", "layout", "outcome", "micro_batch", "grad_accum",
                                "bubble_fraction", "value"]]
                          .rename(columns={"number": "trial", "value": "tflops_per_device"})))
    return s


def _memory(ctx: _Context, trials: pd.DataFrame, capacity: float | None,
            device: str | None) -> Section:
    s = Section("Memory: predicted, measured and device capacity")
    has = trials[trials["predicted_memory_gib"].notna()
                 & (trials["peak_memory_gib"].notna() | (trials["outcome"] == "oom"))]
    if has.empty:
        s.blocks.append(Text("No trial has both a memory prediction and a measured peak "
                             "(or an out-of-memory outcome)."))
        return s
    cap = (f"{capacity:.3g} GiB per {device} device" if capacity is not None
           else f"unknown for device {device!r}")
    s.blocks.append(Text(
        "Each point: one trial's predicted memory per device (the memory model, "
        "autotune.models.memory) against the peak the trainer measured. Points on the dotted "
        f"line were predicted exactly. Device memory: {cap}. Out-of-memory trials have no "
        "measured peak and are drawn as crosses at the capacity."))
    s.blocks.append(ctx.image("memory", "predicted vs measured memory",
                              lambda p: plots.memory_vs_capacity(has, capacity, p)))
    ok = has[has["peak_memory_gib"].notna()]
    if len(ok):
        ratio = ok["peak_memory_gib"] / ok["predicted_memory_gib"]
        s.blocks.append(Text(f"Measured / predicted over {len(ok)} trials: median "
                             f"{ratio.median():.3g}, range {ratio.min():.3g} to "
                             f"{ratio.max():.3g}."))
    return s


def _outcomes(ctx: _Context, trials: pd.DataFrame) -> Section:
    s = Section("Outcomes")
    tried = an.judged(trials)
    s.blocks.append(Table(an.outcome_counts(trials), "trials by outcome"))
    if tried.empty:
        return s
    s.blocks.append(Text(
        "Each cell: one layout (row: tp, pp, ZeRO stage, recompute; column: micro-batch), "
        "coloured by the outcome of its latest trial. Infeasible layouts were refused "
        "before launch (the feasibility check or a smaller layout that ran out of memory); "
        "out-of-memory, failed and timed-out layouts ran."))
    s.blocks.append(ctx.image("outcomes", "outcome of each layout",
                              lambda p: plots.outcomes_map(tried, p)))
    bad = an.failures(trials)
    s.blocks.append(Table(bad, "trials that did not complete, with the reason (the full "
                               "text is the reason column of the exports)"))
    return s


def _cost(ctx: _Context, meas: pd.DataFrame, confirm: ConfirmationCost) -> Section:
    s = Section("Tuning cost")
    if meas.empty:
        s.blocks.append(Text("No trial has run yet: nothing spent."))
        return s
    cost = an.tuning_cost(meas, (confirm.runs, confirm.wall_s, confirm.device_s))
    total = float(cost["device_hours"].iloc[-1])
    round_text = (f" and {confirm.runs} confirmation runs in {confirm.launches} launches "
                  f"({confirm.device_s / 3600.0:.3g} device-hours)" if confirm.runs else "")
    s.blocks.append(Text(
        f"{total:.3g} device-hours spent on {len(meas)} trial executions{round_text}: "
        "elapsed wall time of each run (launch to result) times the devices it held. "
        "Infeasible layouts never ran and cost nothing."))
    s.blocks.append(ctx.image("cost", "device-hours by outcome",
                              lambda p: plots.tuning_cost(cost, p)))
    s.blocks.append(Table(cost))
    return s


def _time(study: optuna.Study) -> Section:
    s = Section("Where the time went")
    rows = [(t.number, t.user_attrs.get(TrialAttr.LAYOUT), t.user_attrs.get(TrialAttr.OUTCOME),
             t.user_attrs.get(TrialAttr.TIMINGS_S) or {},
             t.user_attrs.get(TrialAttr.MEASURED_STEPS),
             t.user_attrs.get(TrialAttr.MEASURE_PRECISION),
             (t.user_attrs.get(TrialAttr.BATCH) or {}))
            for t in study.get_trials(deepcopy=False) if t.user_attrs.get(TrialAttr.TIMINGS_S)]
    total = time_breakdown(r[3] for r in rows)
    if not total.trials:
        s.blocks.append(Text("No trial recorded a time breakdown (a replayed table, a "
                             "user's program, or a study from before breakdowns)."))
        return s
    s.blocks.append(Text(
        f"Each trial's wall time by phase (seconds): {breakdown_line(total)}. The start-up "
        "(process start and imports, rendezvous, device and communicator set-up) is paid "
        "once per launch: in a batch of layouts (trial.batch_size) only the first pays "
        "it. Steps and precision: timed steps and the relative precision of the median "
        "step time they reached (95% distribution-free interval)."))
    frame = pd.DataFrame([{"trial": n, "layout": lay, "outcome": out,
                           **{p: round(float(tim.get(p, 0.0)), 3) for p in PHASES},
                           "steps": steps, "precision": prec,
                           "batch": f"{b.get('index', 0) + 1}/{b.get('size', 1)}"
                           + (" rerun" if b.get("rerun") else "") if b else "1/1"}
                          for n, lay, out, tim, steps, prec, b in rows])
    s.blocks.append(Table(frame, "wall time by phase, per trial"))
    return s


def _importance(ctx: _Context, study: optuna.Study) -> Section:
    s = Section("Parameter importance")
    imp = an.param_importance(study)
    s.blocks.append(Text(f"How much of the variation in model TFLOPS per device each layout "
                         f"axis explains: {imp.note}."))
    if imp.values is not None:
        values = imp.values
        s.blocks.append(ctx.image("importance", "parameter importance",
                                  lambda p: plots.importance(values, p)))
        s.blocks.append(Table(pd.DataFrame({"parameter": list(values),
                                            "importance": list(values.values())})))
    return s
