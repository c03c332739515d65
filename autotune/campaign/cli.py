"""``autotune campaign submit|status|check``: parse, call :mod:`autotune.campaign`, exit code.

Hooked into ``autotune/cli/__init__.py`` with :func:`add_parser`; ``python -m autotune.campaign``
runs the same commands without the main CLI (job scripts use it for ``check``).
Exit codes: 0 ok (``check``: the budget is met), 1 an error, 2 a usage error,
3 (``check`` only) the study still has trials to run.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from autotune.errors import AutotuneError, UsageError
from autotune.util.argtypes import positive_int

__all__ = ["add_parser", "main", "EXIT_BUDGET_OPEN"]

EXIT_BUDGET_OPEN = 3


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``campaign`` with its sub-commands to the main CLI's subparsers."""
    parser = subparsers.add_parser("campaign", help="SLURM campaigns: many studies, job arrays",
                                   description="Run many studies as SLURM job arrays against "
                                               "one shared database (docs/hpc.md).")
    _fill(parser)
    return parser


def _fill(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="campaign_command", required=True)
    p = sub.add_parser("submit", help="render scripts and submit what is not done or queued")
    p.add_argument("file", metavar="CAMPAIGN", help="campaign YAML file")
    p.add_argument("--dry-run", action="store_true", help="render only, submit nothing")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p = sub.add_parser("status", help="trials done/target, best so far, job states")
    p.add_argument("file", metavar="CAMPAIGN")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("check", help="exit 0 if a study's budget is met, 3 if not (for jobs)")
    p.add_argument("study", metavar="STUDY", help="study YAML file (its name is used)")
    p.add_argument("--storage", required=True, help="database URL (${VAR} expanded)")
    p.add_argument("--n-trials", type=positive_int, required=True)


def run(args: argparse.Namespace) -> int:
    """Execute a parsed ``campaign`` command; errors are the caller's to map to exit codes."""
    from autotune.campaign import config, jobs

    if args.campaign_command == "check":
        from autotune.spec import load_study

        study = load_study(args.study)
        met = jobs.budget_met(args.storage, study.name, args.n_trials,
                              study.search.min_improvement)
        print(f"{study.name}: {'done' if met else 'not done'} (budget {args.n_trials} trials"
              + (f", search.min_improvement {study.search.min_improvement:g})"
                 if study.search.min_improvement is not None else ")"))
        return 0 if met else EXIT_BUDGET_OPEN
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        campaign = config.load_campaign(args.file)
        if args.campaign_command == "submit":
            rows = jobs.submit(campaign, dry_run=args.dry_run)
        else:
            rows = jobs.status(campaign)
    for w in {str(w.message) for w in caught}:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        if args.campaign_command == "submit":
            for r in rows:
                print(f"{r.study}: {r.action}" + (f" [{', '.join(r.jobs)}]"
                                                  if r.action == "submitted" else ""))
                if r.error:
                    print(f"  budget not checked: {r.error}", file=sys.stderr)
        else:
            print(jobs.format_status(rows))
    return 1 if any(r.error for r in rows) and args.campaign_command == "status" else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.campaign", description=__doc__)
    _fill(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except AutotuneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
