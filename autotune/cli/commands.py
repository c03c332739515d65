"""The ``autotune`` subcommands: each parses nothing, calls the library and returns an exit
code (:mod:`autotune.cli.parser` builds the flags, :func:`autotune.cli.main` maps errors)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.errors import SpecError, UsageError
from autotune.planning import DEFAULT_TOP
from autotune.trial.outcome import StopReason
from autotune.util.argtypes import positive_int

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPT = 0, 1, 2, 130
Handler = Callable[[argparse.Namespace], int]




def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: seconds > 0") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"got {value}; allowed: seconds > 0")
    return value


def _open(storage_url: str | None, study_arg: str | None,
          command: str):  # -> (Storage, name | None)
    """Storage and study name from a study file (its storage URL) or a bare name."""
    from autotune.config.sqlite_file import require_existing
    from autotune.config.study import StorageConfig
    from autotune.spec import load_study
    from autotune.storage import open_storage

    name = study_arg
    config = StorageConfig()
    if study_arg and (study_arg.endswith((".yaml", ".yml")) or Path(study_arg).is_file()):
        spec = load_study(study_arg)
        name, config = spec.name, spec.storage
    if storage_url:
        config = dataclasses.replace(config, url=storage_url)
    require_existing(config.url, command)  # a read-only command creates no database
    return open_storage(config), name


# -- run ------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from autotune.launchers import make_launchers
    from autotune.planning.empty import refuse_structurally_empty
    from autotune.runner.confirm_options import confirm_overrides, confirm_share, unconfirmed_note
    from autotune.runner.progress import Progress, best_line, stop_message, trials_table
    from autotune.runner.study import run_study
    from autotune.spec import load_study
    from autotune.storage import open_storage

    spec = load_study(args.study)
    if args.storage:
        spec = spec.with_storage_url(args.storage)
    if args.n_trials:
        spec = replace(spec, search=replace(spec.search, n_trials=args.n_trials))
    if args.no_learn:
        spec = replace(spec, search=replace(spec.search, learn_from_database=False))
    refuse_structurally_empty(spec)  # a space of no layout at all touches no database
    spec = confirm_overrides(spec, no_confirm=args.no_confirm, budget=args.confirm_budget)
    # first: a bad launcher section touches no database
    launchers = make_launchers(spec.launcher, spec.model, spec.cluster, spec.training,
                               source=spec.source, workload=spec.workload)
    storage = open_storage(spec.storage, connections=len(launchers))
    n = spec.search.n_trials
    progress = Progress(total=n, enabled=not args.quiet, confirm_share=confirm_share(spec))
    progress.message(f"study {spec.name!r}: {spec.model.name} ({spec.model.n_params() / 1e6:.1f}M "
                     f"params) on {spec.cluster.nodes} x {spec.cluster.devices_per_node} "
                     f"{spec.cluster.device}; workload {spec.workload.kind}; budget {n} trials; "
                     f"storage {storage.masked_url}")
    if len(launchers) > 1:
        progress.message(f"{len(launchers)} trials side by side on disjoint node groups")
    summary = run_study(spec, storage, launchers, n_trials=n, timeout_s=args.timeout,
                        progress=progress, retry_failed=args.retry_failed)
    table = trials_table(summary.trials)
    if table is not None:
        print(table)
    progress.message(stop_message(summary.stopped_by, n_trials=n, reason=summary.stop_reason))
    if summary.best is not None:
        print(best_line(summary.best) + unconfirmed_note(summary.stopped_by))
    if summary.stopped_by in (StopReason.INTERRUPT, StopReason.CONFIRM_INTERRUPT):
        return EXIT_INTERRUPT
    if summary.stopped_by == StopReason.BROKEN_PROGRAM:
        print(f"autotune: {summary.stop_reason}", file=sys.stderr)
        return EXIT_FAIL
    elsewhere = [t for t in summary.trials if t.state.name == "RUNNING"]
    if summary.best is None and summary.stopped_by == StopReason.BUDGET and elsewhere:
        # Other workers claimed the rest of the budget (a batch each) and are measuring it:
        # nothing failed here, there is just nothing left for this worker.
        progress.message(f"the budget is claimed; {len(elsewhere)} trial(s) still running "
                         "in other workers (autotune status shows them)")
        return EXIT_OK
    if summary.best is None and summary.stopped_by != StopReason.SIGTERM:
        if summary.stopped_by == StopReason.TIMEOUT and not summary.trials:
            # nothing was launched: there are no reasons above and no logs to point at
            print("no trial completed: the wall-time budget (--timeout or search.timeout_s) "
                  "ran out before the first trial; give more time", file=sys.stderr)
        else:
            print("no trial completed: see the reasons above and the trial logs under "
                  f"{spec.launcher.run_dir}/{spec.name}/", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


# -- status / best --------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    from autotune.report.results import (
        format_statuses,
        list_studies,
        load_existing_study,
        study_status,
    )

    storage, name = _open(args.storage, args.study, "status")
    names = [name] if name else list_studies(storage)
    if not names:
        print(f"no studies in {storage.masked_url}")
        return EXIT_OK
    from autotune.storage import claim_counts, repair_stale, unfinished_line

    statuses = []
    for n in names:
        study = load_existing_study(storage, n)
        repair_stale(storage, n)  # a dead runner's trial shows as killed, not running
        st = study_status(study)
        st.retries = claim_counts(storage, n).retries
        if st.confirmation is None or "stale" in st.confirmation:
            st.confirmation = unfinished_line(storage, n) or st.confirmation
        statuses.append(st)
    print(format_statuses(statuses))
    from autotune.scaling.command import status_lines

    for line in status_lines(storage, [load_existing_study(storage, n) for n in names]):
        print(line)
    return EXIT_OK


def cmd_best(args: argparse.Namespace) -> int:
    from autotune.report.export import emit_best
    from autotune.report.job_flags import refuse_misplaced_flags
    from autotune.report.results import best_layout, confirmation_line, load_existing_study

    refuse_misplaced_flags(args)  # before a database is opened
    storage, name = _open(args.storage, args.study, "best")
    study = load_existing_study(storage, name)
    layout, trial = best_layout(study)
    if args.emit == "slurm":
        from autotune.report.job_flags import emit_job

        print(emit_job(study, layout, trial, args))
    else:
        print(emit_best(study, layout, trial, fmt=args.emit, out_dir=Path(args.out or ".")))
    line = confirmation_line(study)
    if line:  # on stderr: the emitted JSON, config or command line stays as it was
        print(f"confirmation: {line}", file=sys.stderr)
    return EXIT_OK


def _log(quiet: bool, prefix: str = "autotune") -> Callable[[str], None]:
    """Progress lines on stderr (none with ``--quiet``)."""
    def log(text: str) -> None:
        if not quiet:
            print(f"[{prefix}] {text}", file=sys.stderr, flush=True)
    return log


def cmd_report(args: argparse.Namespace) -> int:
    from autotune.report.build import study_report
    from autotune.report.crossstudy import campaign_report
    from autotune.report.results import load_existing_study

    if args.all:
        storage, _ = _open(args.storage, args.study, "report")
        path = campaign_report(storage, Path(args.out or "reports/campaign"), fmt=args.format,
                               device_type=args.device_type, model=args.model,
                               log=_log(args.quiet))
    else:
        if not args.study:
            raise UsageError("report: give a STUDY (study file or name), or --all for the "
                             "cross-study view")
        if args.device_type or args.model:
            raise UsageError("report: --device-type and --model filter the cross-study view;"
                             " add --all")
        storage, name = _open(args.storage, args.study, "report")
        study = load_existing_study(storage, name)
        path = study_report(storage, study, Path(args.out or f"reports/{name}"),
                            fmt=args.format, log=_log(args.quiet))
    print(path)
    return EXIT_OK


def cmd_dashboard(args: argparse.Namespace) -> int:
    from autotune.config.study import StorageConfig
    from autotune.report.dashboard import serve
    from autotune.spec import load_study

    url = args.storage or (load_study(args.study).storage.url if args.study
                           else StorageConfig().url)
    serve(url, host=args.host, port=args.port)
    return EXIT_OK


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"got {value}; allowed: a port 1-65535")
    return value


def quiet_optuna() -> None:
    """Optuna's INFO lines off (a study created, each trial finished): the commands print
    their own progress lines instead."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def cmd_plan(args: argparse.Namespace) -> int:
    from autotune.config.sqlite_file import nothing_to_read
    from autotune.planning.empty import refuse_empty
    from autotune.planning.plan import plan_study, render_plan
    from autotune.runner.learning import plan_calibration
    from autotune.spec import load_study

    spec = load_study(args.study)
    if args.storage:  # the database to calibrate from (as `run --storage`)
        spec = spec.with_storage_url(args.storage)
    if not nothing_to_read(spec.storage.url):
        # Only a plan that reads a database loads Optuna (~0.2 s of the 2 s a 175B plan
        # may take: benchmarks/plan_cpu_time.py).
        quiet_optuna()
    if args.scaling or args.nodes or args.devices or args.reference:
        from autotune.scaling.command import plan_command

        if not args.scaling:
            raise UsageError("plan: --nodes, --devices and --reference go with --scaling "
                             "weak|strong")
        if args.top is not None:  # before: silently ignored
            raise UsageError("plan: --top K lists the best layouts of one size; --scaling "
                             "shows the best layout at each size")
        print(plan_command(spec, args))
        return EXIT_OK
    learn = spec.search.learn_from_database and not args.no_learn
    calibration, ooms, fits, note = plan_calibration(spec, learn=learn)
    if note:
        print(f"autotune: {note}", file=sys.stderr)
    result = plan_study(spec, top=args.top or DEFAULT_TOP, calibration=calibration,
                        ooms=tuple(ooms), fits=tuple(fits), learn_enabled=learn)
    print(render_plan(result, args.format))
    return EXIT_OK if not result.empty_reasons else refuse_empty(spec, result.empty_reasons)


def _layer_counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",")}))
    except ValueError:
        values = ()
    if len(values) < 2 or values[0] < 1:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; allowed: two or more distinct layer counts >= 1, e.g. 1,2")
    return values


def cmd_profile(args: argparse.Namespace) -> int:
    from autotune.profiling.command import profile_landscape, profile_study

    if (args.study is None) == (args.from_landscape is None):
        raise SpecError("STUDY / --from-landscape", args.study or args.from_landscape,
                        "allowed: exactly one of a study file and --from-landscape CSV")
    if args.from_landscape is None:
        table = _table_options(args)
        if table:
            name, value = next(iter(table.items()))
            raise SpecError(f"--{name.replace('_', '-')}", value,
                            "allowed only with --from-landscape (a study file says it itself)")
        run = profile_study(args.study, out=Path(args.out) if args.out else None,
                            top=args.top, layers=args.layers, log=_log(args.quiet, "profile"))
        return EXIT_INTERRUPT if run.interrupted else EXIT_OK
    if args.out is None:
        raise SpecError("--out", None, "required with --from-landscape")
    if args.top or args.layers:
        raise SpecError("--top / --layers", args.top or args.layers,
                        "allowed only when measuring a study (they choose the runs)")
    profile_landscape(str(_table_path(args.from_landscape)), Path(args.out),
                      **_table_options(args))
    return EXIT_OK


def _table_path(text: str) -> str | Path:
    """A table the user named: its path, or the name of a shipped one (data/landscapes/)
    where no such file is here."""
    from autotune.landscape import SHIPPED_LANDSCAPES, shipped_landscape

    return shipped_landscape(text) if text in SHIPPED_LANDSCAPES and not Path(
        text).exists() else text


def _table_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--from-landscape`` options given, as
    :func:`autotune.landscape.load_landscape` keywords (the others keep its defaults)."""
    return {k: getattr(args, k) for k in ("hardware", "devices_per_node", "vocab_size",
                                          "attention") if getattr(args, k) is not None}


def cmd_landscapes(args: argparse.Namespace) -> int:
    import json

    from autotune.landscape import load_landscape
    from autotune.landscape.listing import group_summaries
    from autotune.util.text import format_table

    path = _table_path(args.table)
    groups = load_landscape(path, field="CSV", **_table_options(args))
    rows = group_summaries(groups)
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    shown = ("index", "name", "device", "devices", "global_batch", "rows", "ok", "oom",
             "best_layout", "best_model_tflops_per_device")  # of SUMMARY_COLUMNS: one line
    print(f"{path}: {len(groups)} group(s); a replayed study takes the one with its model, "
          "world size and global batch, or launcher.replay.group: INDEX")
    print(format_table([c.replace("best_model_tflops_per_device", "best TFLOPS/dev")
                        for c in shown], [[r[c] for c in shown] for r in rows]))
    return EXIT_OK


def cmd_scaling(args: argparse.Namespace) -> int:
    from autotune.scaling.command import run_command

    return run_command(args, _log(args.quiet, "scaling"))


def cmd_campaign(args: argparse.Namespace) -> int:
    from autotune.campaign.cli import run

    return run(args)
