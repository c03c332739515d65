"""The user's own training program as a trial: ``command`` and ``megatron-deepspeed``.

Per trial, :class:`ForeignWorkload`

* writes ``ds_config.json`` (:meth:`prepare`): the layout's batch and ZeRO keys from
  :func:`autotune.dsconfig.batch_config` (so that they agree with the flags), DeepSpeed's
  step line on every step, and the study's ``workload.ds_config`` extras;
* builds the command (:meth:`argv`): the template with its placeholders filled
  (:func:`fill`), or the Megatron-DeepSpeed script with the user's arguments and the flags
  autotune owns (:mod:`autotune.workloads.megatron`), behind the launcher's rank-variable
  prefix where it needs one (srun);
* exports ``AUTOTUNE_METRICS_FILE``, ``AUTOTUNE_TRIAL_DIR`` and ``AUTOTUNE_DS_CONFIG``;
* watches the metrics file and the logs for new steps (:meth:`watch`): none for
  ``workload.no_progress_s`` and the launcher kills the trial;
* once it ended, reads its steps back and scores them (:mod:`autotune.workloads.readback`),
  has the outcome decided (:func:`autotune.trial.classify.classify`, with the signatures
  of :mod:`autotune.workloads.oom_signatures`) and writes the
  trial's ``result.json`` (status ``ok``, ``oom`` or ``error``) atomically (:meth:`finish`);
  the report carries that verdict (:attr:`autotune.trial.report.LaunchReport.verdict`).

A trial runs ``train_iters`` = warm-up + the step cap (``trial.max_measure_steps`` with
``trial.measure_precision``, else ``trial.measure_steps``); at least one step is dropped as
warm-up, whatever ``trial.warmup_steps`` says (a program's first step includes its start-up).
With ``trial.measure_precision`` the program is stopped as soon as its median step time is
known that precisely (:mod:`autotune.workloads.adaptive`, the built-in trainer's rule).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autotune.config.cluster import ClusterConfig
from autotune.config.workload import WorkloadConfig
from autotune.dsconfig import batch_config
from autotune.errors import SpecError
from autotune.metrics_writer import ENV_VAR
from autotune.trial import LaunchReport, TrialPaths, TrialResult, TrialSpec
from autotune.trial.classify import classify
from autotune.trial.measurement import StopRule, relative_precision
from autotune.trial.numbers import check_result_numbers
from autotune.trial.outcome import Outcome
from autotune.util.atomic import write_json_atomic
from autotune.workloads import megatron
from autotune.workloads.adaptive import MeasuringWatch
from autotune.workloads.base import Placement, ProgressWatch, Workload, log_paths
from autotune.workloads.error_line import program_error_line
from autotune.workloads.oom_signatures import OOM_SIGNATURES
from autotune.workloads.readback import StepCounter, measure, read_back

__all__ = ["ForeignWorkload", "CommandWorkload", "MegatronWorkload", "fill",
           "placeholder_values", "warmup_steps", "train_iters", "steps_of", "stop_rule",
           "trial_ds_config"]

_LOG_TEXT_CHARS = 256_000
"""How much of a trial's output the out-of-memory signatures are looked for in."""


def steps_of(warmup: int, measure: int, *, foreign: bool = True) -> int:
    """Optimizer steps a trial runs: warm-up (for a foreign program at least one) plus
    measured."""
    return (max(1, warmup) if foreign else warmup) + measure


def warmup_steps(spec: TrialSpec) -> int:
    """Steps dropped before the median: ``trial.warmup_steps``, at least one."""
    return max(1, spec.run.warmup_steps)


def train_iters(spec: TrialSpec) -> int:
    """Optimizer steps a foreign trial is started with: warm-up plus the step cap (the
    adaptive measurement may stop it before)."""
    return steps_of(spec.run.warmup_steps, spec.run.step_cap)


def stop_rule(spec: TrialSpec) -> StopRule:
    """When a foreign trial has measured enough: the built-in trainer's rule, from the same
    ``run`` settings (:meth:`autotune.trial.measurement.StopRule.of`)."""
    return StopRule.of(spec.run, spec.model, spec.layout, spec.layout.world_size,
                       best_tflops=spec.run.best_model_tflops_per_device)


def placeholder_values(spec: TrialSpec, paths: Any, placement: Placement) -> dict[str, Any]:
    """What each placeholder of :data:`autotune.config.workload.PLACEHOLDERS` stands for in
    this trial (``paths``: a :class:`~autotune.trial.TrialPaths` or anything with
    ``root``, ``ds_config`` and ``metrics``)."""
    lay = spec.layout
    return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "micro_batch": lay.micro_batch,
            "grad_accum": lay.grad_accum, "global_batch": lay.global_batch,
            "zero_stage": lay.zero_stage, "recompute": lay.recompute,
            "sequence_parallel": "true" if lay.sequence_parallel else "false",
            "ds_config": str(paths.ds_config), "trial_dir": str(paths.root),
            "metrics_file": str(paths.metrics), "train_iters": train_iters(spec),
            "world_size": lay.world_size, "nodes": placement.nodes,
            "ranks_per_node": placement.ranks_per_node,
            "master_addr": placement.master_addr or "127.0.0.1",
            "master_port": placement.master_port}


def fill(template: tuple[str, ...] | list[str], values: dict[str, Any]) -> list[str]:
    """The template's items with their placeholders replaced (validated at load time).

    >>> fill(["train.py", "--mb={micro_batch}", "{{literal}}"], {"micro_batch": 4})
    ['train.py', '--mb=4', '{literal}']
    """
    return [item.format(**values) for item in template]


def trial_ds_config(spec: TrialSpec, extra: dict[str, Any]) -> dict[str, Any]:
    """The trial's DeepSpeed config: the layout's keys, DeepSpeed's per-step log line
    (``steps_per_print: 1``: the pipeline engine's line is a fallback source) and the
    study's extras (which never include the layout's keys: checked at load)."""
    config = {**batch_config(spec.layout, spec.run.dtype), "steps_per_print": 1}
    config.update(extra)
    return config


class ForeignWorkload(Workload):
    """What ``command`` and ``megatron-deepspeed`` share (module docstring)."""

    oom_signatures = OOM_SIGNATURES

    def __init__(self, config: WorkloadConfig, cluster: ClusterConfig) -> None:
        self.config = config
        self.per_device = config.outer == "per-device"
        self.device_name = cluster.device
        self._device = cluster.device_spec()

    # -- before and during the run ------------------------------------------------------

    def prepare(self, spec: TrialSpec, paths: TrialPaths) -> None:
        write_json_atomic(paths.ds_config, trial_ds_config(spec, self.config.ds_config))

    def env(self, spec: TrialSpec, paths: TrialPaths) -> dict[str, str]:
        return {**self.config.env, ENV_VAR: str(paths.metrics),
                "AUTOTUNE_TRIAL_DIR": str(paths.root), "AUTOTUNE_DS_CONFIG": str(paths.ds_config)}

    def watch(self, spec: TrialSpec, paths: TrialPaths) -> ProgressWatch:
        counter = StepCounter([paths.metrics, *log_paths(paths)])
        rule = stop_rule(spec)
        lock_env = {**os.environ, **self.config.env}  # where its torch build locks are
        if rule.adaptive:  # stopped once measured enough (autotune.workloads.adaptive)
            return MeasuringWatch(counter, rule=rule, drop=warmup_steps(spec),
                                  first_step_s=self.config.first_step_s,
                                  no_progress_s=self.config.no_progress_s,
                                  expected_steps=train_iters(spec), lock_env=lock_env)
        return ProgressWatch(counter, first_step_s=self.config.first_step_s,
                             no_progress_s=self.config.no_progress_s,
                             expected_steps=train_iters(spec), lock_env=lock_env)

    def _prefix(self, placement: Placement) -> list[str]:
        return list(placement.rank_env) if self.per_device else []

    # -- after the run ------------------------------------------------------------------

    def finish(self, spec: TrialSpec, paths: TrialPaths, report: LaunchReport) -> None:
        logs = log_paths(paths)
        rb = read_back(paths.metrics, logs, drop=warmup_steps(spec))
        expected = train_iters(spec)
        report.readback = {**rb.summary(), "expected": expected}
        report.log_text = "\n".join(_tail_text(p, _LOG_TEXT_CHARS) for p in logs)
        # The rank's own error first (a failing rank's file), then stderr, then stdout:
        # torchrun's summary at the end of stderr is never the cause.
        report.error_line = program_error_line(
            [_tail_text(p, _LOG_TEXT_CHARS) for p in paths.rank_errors()],
            *(_tail_text(p, _LOG_TEXT_CHARS) for p in (paths.stderr, paths.stdout)))
        peak = self._device.peak_tflops(spec.run.dtype)
        try:
            measured = measure(rb, model=spec.model, layout=spec.layout, dtype=spec.run.dtype,
                               device=self.device_name,
                               peak_flops=peak * 1e12 if peak else None,
                               expected_steps=expected)
            if measured is not None:
                _with_precision(measured, spec, report.measured_stop)
                check_result_numbers(measured.to_dict())
        except SpecError as err:  # a degenerate number read back: the trial's error
            measured, report.result_error = None, f"invalid read-back: {err}"
        report.result = measured
        verdict = classify(report, self.oom_signatures)
        status = {Outcome.COMPLETE: "ok", Outcome.OOM: "oom"}.get(verdict.kind, "error")
        result = measured or TrialResult(
            status=status, losses=[r.loss for r in rb.records if r.loss is not None],
            world_size=spec.layout.world_size, device=self.device_name,
            layout=spec.layout.to_dict(), extra={"readback": report.readback})
        result.status = status
        result.error = None if status == "ok" else verdict.reason
        if report.measured_stop is not None:
            result.extra["measurement_stop"] = report.measured_stop
        result.elapsed_s = report.elapsed_s
        result.extra["workload"] = self.kind
        result.write(paths.result)
        # The result file says what was decided from the evidence before it replaced the
        # report's result: the runner records that verdict, not one decided afresh.
        report.result, report.verdict = result, verdict

    def describe(self) -> dict[str, str]:
        return {"workload": self.kind, "outer": self.config.outer}


class CommandWorkload(ForeignWorkload):
    """``workload.kind: command``: the argv template, placeholders filled."""

    kind = "command"

    def argv(self, spec: TrialSpec, paths: TrialPaths, placement: Placement) -> list[str]:
        values = placeholder_values(spec, paths, placement)
        return [*self._prefix(placement), *fill(self.config.argv, values)]


class MegatronWorkload(ForeignWorkload):
    """``workload.kind: megatron-deepspeed``: ``PYTHON SCRIPT USER-ARGS OWNED-FLAGS``."""

    kind = "megatron-deepspeed"

    def argv(self, spec: TrialSpec, paths: TrialPaths, placement: Placement) -> list[str]:
        values = placeholder_values(spec, paths, placement)
        user = fill(self.config.args, values)
        python = self.config.python or placement.python
        return [*self._prefix(placement), python, str(self.config.script), *user,
                *megatron.layout_args(spec.layout, dtype=spec.run.dtype, use_mics=(
                    megatron.script_has_use_mics(self.config.script))),
                *megatron.model_args(spec.model, given=user, kernels=False),
                *megatron.trial_args(train_iters=train_iters(spec),
                                     ds_config=str(paths.ds_config))]


def _with_precision(result: TrialResult, spec: TrialSpec,
                    stop: dict[str, Any] | None) -> None:
    """The precision the median reached, as the built-in trainer stores it
    (trainer/results.py), and a hopeless verdict as its early stop."""
    result.measure_confidence = spec.run.confidence
    result.measure_precision = relative_precision(result.step_times_s, spec.run.confidence)
    if stop is not None and stop.get("reason") == "hopeless":
        result.early_stopped = True
        result.early_stop_reason = stop.get("detail")


def _tail_text(path: Path, chars: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - chars))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
