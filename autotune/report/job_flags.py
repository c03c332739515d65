"""The ``autotune best`` flags of ``--emit slurm`` (:mod:`autotune.report.job_script`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.layout import Layout
from autotune.util.argtypes import positive_int

if TYPE_CHECKING:  # every command builds the parser: Optuna loads where a study is read
    import optuna
    from optuna.trial import FrozenTrial

__all__ = ["add_job_flags", "emit_job"]


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """``--site``, ``--steps``, ``--time``, ``--partition``, ``--account``."""
    group = parser.add_argument_group("--emit slurm (the production job script)")
    group.add_argument("--site", metavar="NAME", help="site profile (autotune/sites/*.yaml "
                       "name or file; default: the study's launcher.slurm.site)")
    group.add_argument("--steps", type=positive_int, metavar="N", help="optimizer steps of the "
                       "production run (default: workload.production_train_iters)")
    group.add_argument("--time", default="01:00:00", metavar="T",
                       help="job time limit, SLURM format (default: 01:00:00)")
    group.add_argument("--partition", metavar="P", help="SLURM partition (default: the "
                       "site's)")
    group.add_argument("--account", metavar="A", help="SLURM account to charge")


def emit_job(study: optuna.Study, layout: Layout, trial: FrozenTrial,
             args: argparse.Namespace) -> str:
    """Write the job script from the parsed flags; what to print (its path)."""
    from autotune.report.job_script import JobOptions, write_job

    options = JobOptions(site=args.site, steps=args.steps, time=args.time,
                         partition=args.partition, account=args.account)
    path = write_job(study, layout, options=options, out_dir=Path(args.out),
                     value=trial.value)
    print(f"autotune: submit it with: sbatch {path}", file=sys.stderr)  # stdout: the path
    return str(path)
