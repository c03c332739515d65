"""The ``autotune best`` flags of ``--emit slurm`` (:mod:`autotune.report.job_script`)."""

from __future__ import annotations

import argparse

__all__ = ["add_job_flags"]


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an integer >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {value}; allowed: an integer >= 1")
    return value


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """``--site``, ``--steps``, ``--time``, ``--partition``, ``--account``."""
    group = parser.add_argument_group("--emit slurm (the production job script)")
    group.add_argument("--site", metavar="NAME", help="site profile (autotune/sites/*.yaml "
                       "name or file; default: the study's launcher.slurm.site)")
    group.add_argument("--steps", type=_steps, metavar="N", help="optimizer steps of the "
                       "production run (default: workload.production_train_iters)")
    group.add_argument("--time", default="01:00:00", metavar="T",
                       help="job time limit, SLURM format (default: 01:00:00)")
    group.add_argument("--partition", metavar="P", help="SLURM partition (default: the "
                       "site's)")
    group.add_argument("--account", metavar="A", help="SLURM account to charge")
