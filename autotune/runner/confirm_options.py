"""The confirmation round's command-line options for ``autotune run``, and its end line.

Owns ``--confirm-budget X`` (``search.confirm_budget``) and ``--no-confirm``
(``search.confirm: 0``), applied over the study file (:func:`confirm_overrides`), and the
note the best line gets when the round was cut short (:func:`unconfirmed_note`).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from autotune.config.study import MAX_CONFIRM_BUDGET
from autotune.spec import StudySpec

__all__ = ["add_confirm_arguments", "confirm_overrides", "confirm_share", "unconfirmed_note"]


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= MAX_CONFIRM_BUDGET:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; allowed: a fraction of the search's device-seconds, 0 to "
            f"{MAX_CONFIRM_BUDGET:g} (0.25 = a quarter)")
    return value


def add_confirm_arguments(parser: argparse.ArgumentParser) -> None:
    # One or the other: a budget for a round that --no-confirm turns off says two things
    # (argparse refuses the pair with both flags named, exit 2).
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--confirm-budget", type=_budget, metavar="X", default=None,
                       help="device-seconds the confirmation round may spend, as a fraction "
                            "of the search's (search.confirm_budget, default 0.25)")
    group.add_argument("--no-confirm", action="store_true",
                       help="no confirmation round (search.confirm: 0)")


def confirm_overrides(spec: StudySpec, *, no_confirm: bool, budget: float | None) -> StudySpec:
    """``spec`` with the command line's confirmation options over the study file's."""
    search = spec.search
    if no_confirm:
        search = replace(search, confirm=0)
    if budget is not None:
        search = replace(search, confirm_budget=budget)
    return spec if search is spec.search else replace(spec, search=search)


def confirm_share(spec: StudySpec) -> float:
    """The most the confirmation round adds to the run's time, as a fraction of the
    search's (its device budget: one world size, so device-seconds and wall time scale
    alike); 0 with the round off."""
    return spec.search.confirm_budget if spec.search.confirm >= 2 else 0.0


def unconfirmed_note(stopped_by: str) -> str:
    """What the best line adds when the confirmation round did not finish."""
    if stopped_by in ("confirm_interrupt", "confirm_timeout"):
        return " (unconfirmed: the confirmation round did not finish)"
    return ""
