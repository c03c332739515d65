"""The shared SQL database, and the one door to it: what the runner, the report, the
scaling, the campaign and the CLI import of storage is imported from here.

:class:`TrialStore` (:mod:`autotune.storage.store`) is how a trial lives in the
database: claimed with a lease, recorded, repaired; its narrow reads. :class:`Storage`
(:mod:`autotune.storage.db`) is the connection, the session scope and the one retry layer.
The rest are the names the readers need: the attribute keys (:class:`TrialAttr`,
:class:`StudyAttr`), the readers and writers of a trial's and a study's records, the
values a stored trial reads back with. The modules behind them (``_optuna_rdb``,
``claims``, ``confirmations``, ``judged``, ``keys``, ``leases``, ``records``,
``study_records``, ``values``, ``schema``) are this package's own: nothing outside it
imports them (``tests/test_architecture.py``). :mod:`autotune.storage.urls` is the other
public module (the launchers and the campaign mask and check URLs with it); importing it
still runs this door, so a command that must not load the database decides first, with
:func:`autotune.config.sqlite_file.nothing_to_read`, whether there is one to read.
"""

from __future__ import annotations

from autotune.storage._optuna_rdb import CONSTRAINT_ATTR
from autotune.storage.claims import (
    ClaimCounts,
    ClaimRequest,
    Refused,
    claim_counts,
    claim_first,
    claim_lease,
    record_execution,
    repair_stale,
    retry_keys,
    store_verdict,
)
from autotune.storage.confirmations import (
    ConfirmationCost,
    ConfirmClaimed,
    ConfirmRefused,
    claim_confirmation,
    confirmation_cost,
    confirmation_lease,
    decided_record,
    finish_confirmation,
    record_round,
    release_confirmation,
    stored_runs,
    unfinished_line,
)
from autotune.storage.db import Storage, engine_kwargs, open_storage
from autotune.storage.guarded import database_error, one_line
from autotune.storage.judged import (
    FINISHED,
    SUMMARY_KEYS,
    AnyTrial,
    JudgedTrial,
    best_judged,
    highest,
    judged_trials,
    read_best_trial,
    whole,
)
from autotune.storage.keys import SKIPPED, StudyAttr, TrialAttr
from autotune.storage.leases import Lease, utcnow
from autotune.storage.records import (
    TrialFacts,
    best_trial,
    measurement_row,
    set_user_attrs,
    trial_energy,
    trial_energy_line,
    trial_layout,
    trial_layout_key,
    trial_outcome,
    trial_reason,
    trial_tokens_per_s,
    user_attrs,
    verdict_attrs,
)
from autotune.storage.schema import ConfirmationRun, LayoutClaim, Measurement
from autotune.storage.store import Claim, TrialStore
from autotune.storage.study_records import (
    learned_from_line,
    learned_from_of,
    learned_from_record,
    search_stop_line,
    search_stop_of,
    search_stop_record,
    search_stop_threshold,
    study_attrs,
    study_device_memory_gib,
    study_fingerprint,
    study_workload,
    workload_record,
)
from autotune.storage.urls import backend_of, mask_env, mask_url, resolve_url
from autotune.storage.values import complete_only, measured_value, step_tflops, stored_value

__all__ = [
    "TrialStore", "Claim", "Storage", "open_storage", "engine_kwargs", "Lease", "utcnow",
    "ClaimCounts", "ClaimRequest", "Refused", "claim_counts", "repair_stale",
    "claim_first", "claim_lease", "record_execution", "retry_keys", "store_verdict",
    "best_judged",
    "ConfirmationCost", "ConfirmClaimed", "ConfirmRefused", "claim_confirmation",
    "confirmation_cost", "confirmation_lease",
    "decided_record", "finish_confirmation", "record_round", "release_confirmation",
    "stored_runs", "unfinished_line", "CONSTRAINT_ATTR", "database_error", "one_line",
    "FINISHED", "SUMMARY_KEYS", "AnyTrial", "JudgedTrial", "highest", "judged_trials",
    "read_best_trial", "whole", "SKIPPED", "StudyAttr", "TrialAttr", "TrialFacts",
    "best_trial", "measurement_row", "set_user_attrs", "trial_energy", "trial_energy_line",
    "trial_layout", "trial_layout_key", "trial_outcome", "trial_reason",
    "trial_tokens_per_s", "user_attrs", "verdict_attrs", "LayoutClaim", "Measurement",
    "ConfirmationRun",
    "learned_from_line", "learned_from_of", "learned_from_record", "search_stop_line",
    "search_stop_of", "search_stop_record", "search_stop_threshold", "study_attrs",
    "study_device_memory_gib", "study_fingerprint", "study_workload", "workload_record",
    "backend_of", "mask_env", "mask_url", "resolve_url", "complete_only", "measured_value",
    "step_tflops", "stored_value",
]
