"""The runner's input and output through Optuna: open a study, read its history, the
parameters a layout's trial is created with.

The loop (:mod:`autotune.runner.study`) decides; this module knows how a study is opened
and read. Trials are created and finished in autotune's own transactions
(:mod:`autotune.storage.claims`: a claim with its trial, a record with its measurement);
what the attributes are called and hold is :mod:`autotune.storage.records`'s; which Optuna
state an outcome is told as is :mod:`autotune.trial.outcome`'s.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from autotune.hardware import GiB
from autotune.layout import Layout
from autotune.runner.identity import check_identity, fingerprint_of, launcher_record, space_of
from autotune.search import Observation, dominated_by_oom
from autotune.spec import StudySpec
from autotune.storage import (
    AnyTrial,
    Storage,
    StudyAttr,
    judged_trials,
    set_user_attrs,
    study_attrs,
    study_fingerprint,
    trial_layout,
    trial_outcome,
    workload_record,
)
from autotune.trial.outcome import OUTCOME_KINDS, Outcome

__all__ = ["open_study", "fingerprint_of", "history", "observations", "layout_params",
           "NoSampling", "set_search_stop"]


def open_study(spec: StudySpec, storage: Storage, *, create: bool = True) -> optuna.Study:
    """Create or load the Optuna study; refuse to mix a different model or cluster into it."""
    fingerprint = fingerprint_of(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if create:
            study = optuna.create_study(
                study_name=spec.name, storage=storage.optuna, direction="maximize",
                load_if_exists=True,
                sampler=NoSampling())
        else:
            study = optuna.load_study(study_name=spec.name, storage=storage.optuna,
                                      sampler=NoSampling())
    existing: dict[str, Any] | None = study_fingerprint(study) or None
    if existing is not None and isinstance(existing.get("model"), dict):
        # Studies created before ModelConfig had ``mlp`` / ``attention`` / ``dropout`` ran
        # the (then only) GELU MLP and SDPA attention, without dropout.
        existing = {**existing, "model": {"mlp": "gelu", "attention": "flash",
                                          "dropout": 0.0, **existing["model"]}}
    if existing is None and create:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["model_tflops_per_device"])
        cluster = spec.cluster
        set_user_attrs(study, study_attrs(
            fingerprint, model=spec.model.name,
            cluster=f"{cluster.nodes} x {cluster.devices_per_node} {cluster.device}",
            device_memory_gib=round(cluster.device_spec().memory_bytes / GiB, 3)))
    elif existing is not None:
        upgrade, note = check_identity(spec, storage.masked_url, existing,
                                       study.user_attrs.get(StudyAttr.SPACE))
        if upgrade is not None and create:
            study.set_user_attr(StudyAttr.FINGERPRINT, upgrade)  # fields added since
        if note is not None and create:
            print(f"[autotune] {note}", file=sys.stderr, flush=True)
    if create:
        study.set_user_attr(StudyAttr.SPACE, space_of(spec))
        from autotune.workloads.foreign import steps_of

        # What a trial is started with: warm-up + the step cap (a foreign one may be
        # stopped before, once measured: autotune.workloads.adaptive).
        steps = steps_of(spec.trial.warmup_steps, spec.run_config().step_cap,
                         foreign=spec.workload.foreign)
        per_node = min(spec.world_size, spec.cluster.devices_per_node)
        from autotune.objective import selection_record

        study.set_user_attr(StudyAttr.SELECTION, selection_record(
            spec.search.objective, spec.search.throughput_within))
        study.set_user_attr(StudyAttr.WORKLOAD, workload_record(
            spec.workload.to_dict(), train_iters=steps, ranks_per_node=per_node,
            launcher=launcher_record(spec.launcher)))
    return study


def history(storage: Storage, study_name: str, claimed: dict[str, int]) -> list[Observation]:
    """What the strategy needs to know (:func:`observations`) of the study's finished
    trials, read narrowly (:func:`autotune.storage.judged.judged_trials`: their number,
    state, value, layout and outcome, not Optuna's whole trials)."""
    return observations(judged_trials(storage, study_name), claimed)


def observations(trials: Sequence[AnyTrial], claimed: dict[str, int]) -> list[Observation]:
    """Measured layouts with their values among the finished ``trials`` (in number order),
    and layouts claimed by running trials (``pending``: never proposed twice).

    A proposal refused because it needs no less memory than a measured OOM is, to the
    strategy, an OOM too: what measuring it would have found (the benchmark measures it
    and finds that), and what keeps a strategy that does not skip such layouts itself
    (``grid``, ``random``, ``tpe``, ``gp``) from proposing it again and again.
    """
    judged = [(t, _observed(t)) for t in trials]  # each trial's layout parsed once
    ooms = [obs for _, obs in judged if obs and obs.status == "oom"]
    out: list[Observation] = []
    seen: set[str] = set()
    for t, obs in judged:
        if obs is None and trial_outcome(t) == Outcome.INFEASIBLE:
            layout = trial_layout(t)
            if (layout is not None and layout.key() not in seen
                    and dominated_by_oom(layout, ooms) is not None):
                obs = Observation(layout, "oom")
        if obs is None:
            continue
        seen.add(obs.layout.key())
        out.append(obs)
    for key in claimed:
        if key not in seen:
            out.append(Observation(Layout.from_key(key), "pending"))  # claims hold keys
    return out


def _observed(trial: AnyTrial) -> Observation | None:
    """The observation a judged trial is (``None``: it says nothing about throughput)."""
    # What the outcome tells a strategy (Outcome.observed); interrupted, infeasible and
    # skipped trials say nothing about their layout's throughput.
    kind = trial_outcome(trial)
    status = Outcome(kind).observed if kind in OUTCOME_KINDS else None
    layout = trial_layout(trial) if status is not None else None
    if status is None or layout is None:
        return None
    return Observation(layout, status, trial.value if status == "ok" else None)


class NoSampling(optuna.samplers.BaseSampler):
    """The study's sampler: it never samples. Every trial is created for the strategy's
    layout (:func:`layout_params`, :func:`autotune.storage.claims.claim_layout`); an
    ``ask()`` that fell back to a sampler would invent layouts outside the study's
    axes, so one that reaches this sampler is a bug and fails loudly."""

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        raise RuntimeError(f"autotune studies are not sampled by Optuna (asked for "
                           f"{param_name!r} of trial {trial.number}): trials are created "
                           "for the strategy's layout")


def layout_params(layout: Layout, spec: StudySpec) -> dict[str, tuple[Any, BaseDistribution]]:
    """The trial's per-axis parameters (what optuna-dashboard plots), each with a
    distribution over the study's own values of its axis
    (:func:`autotune.runner.param_space.layout_distributions`: a constant axis is
    single-valued, so the dashboard's importance gives it no credit)."""
    from autotune.runner.param_space import layout_distributions

    params = layout.params()
    dists = layout_distributions(layout, spec)
    return {name: (params[name], dists[name]) for name in dists}


def set_search_stop(study: optuna.Study, record: dict[str, Any] | None) -> None:
    """Record why the search stopped early (a :func:`~autotune.storage.study_records.
    search_stop_record`), or clear it (``None``) when it no longer holds."""
    study.set_user_attr(StudyAttr.SEARCH_STOP, record)
