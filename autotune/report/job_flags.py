"""The ``autotune best`` flags of ``--emit slurm`` (:mod:`autotune.report.job_script`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UsageError
from autotune.layout import Layout
from autotune.report import DEFAULT_JOB_TIME
from autotune.util.argtypes import positive_int

if TYPE_CHECKING:  # every command builds the parser: Optuna loads where a study is read
    import optuna
    from optuna.trial import FrozenTrial

__all__ = ["add_job_flags", "emit_job", "refuse_misplaced_flags"]

JOB_FLAGS = ("site", "steps", "time", "partition", "account")
"""The flags of ``--emit slurm`` alone (``argparse`` dests)."""
WRITES_FILES = ("deepspeed", "command", "slurm")
"""The ``--emit`` formats that write into ``--out`` (the others only print)."""


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """``--site``, ``--steps``, ``--time``, ``--partition``, ``--account``."""
    group = parser.add_argument_group("--emit slurm (the production job script)")
    group.add_argument("--site", metavar="NAME", help="site profile (autotune/sites/*.yaml "
                       "name or file; default: the study's launcher.slurm.site)")
    group.add_argument("--steps", type=positive_int, metavar="N", help="optimizer steps of the "
                       "production run (default: workload.production_train_iters)")
    group.add_argument("--time", metavar="T",
                       help=f"job time limit, SLURM format (default: {DEFAULT_JOB_TIME})")
    group.add_argument("--partition", metavar="P", help="SLURM partition (default: the "
                       "site's)")
    group.add_argument("--account", metavar="A", help="SLURM account to charge")


def emit_job(study: optuna.Study, layout: Layout, trial: FrozenTrial,
             args: argparse.Namespace) -> str:
    """Write the job script from the parsed flags; what to print (its path)."""
    from autotune.report.job_script import JobOptions, write_job

    options = JobOptions(site=args.site, steps=args.steps, time=args.time or DEFAULT_JOB_TIME,
                         partition=args.partition, account=args.account)
    path = write_job(study, layout, options=options, out_dir=Path(args.out or "."),
                     value=trial.value)
    print(f"autotune: submit it with: sbatch {path}", file=sys.stderr)  # stdout: the path
    return str(path)


def refuse_misplaced_flags(args: argparse.Namespace) -> None:
    """A flag the chosen ``--emit`` does not use is a usage error that names it (exit 2),
    as ``plan --nodes`` without ``--scaling`` is: ``--site``/``--steps``/``--time``/
    ``--partition``/``--account`` with another format than ``slurm``, and ``--out`` with
    one that writes no file (``json``, ``megatron-deepspeed``). Silently ignored, a user
    would look in ``--out`` for a file that was never written, or submit a job script
    without the time limit typed."""
    given = [f"--{name}" for name in JOB_FLAGS if getattr(args, name, None) is not None]
    if given and args.emit != "slurm":
        raise UsageError(f"best: {', '.join(given)} go with --emit slurm (the production job "
                         f"script), not --emit {args.emit}")
    if getattr(args, "out", None) is not None and args.emit not in WRITES_FILES:
        raise UsageError(f"best: --out DIR is where --emit {', '.join(WRITES_FILES)} write "
                         f"their files; --emit {args.emit} only prints (redirect it: > FILE)")
