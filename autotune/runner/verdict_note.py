"""The confirmation round's verdict where a person reads it: a study user attribute
(``confirmation_verdict``, one line, shown by optuna-dashboard and ``study.user_attrs``)
and the study's note in optuna-dashboard (its Markdown panel on the study page).

The full record stays the ``confirmation`` attribute (a dict for programs); this is the
sentence ``autotune run`` printed. A note someone wrote by hand is never overwritten: the
note is replaced only while it is empty or still the one autotune wrote (it starts with
:data:`NOTE_HEADING`). optuna-dashboard is an optional dependency; without it only the
attribute is written.
"""

from __future__ import annotations

import optuna

__all__ = ["VERDICT_ATTR", "NOTE_HEADING", "publish_verdict"]

VERDICT_ATTR = "confirmation_verdict"
NOTE_HEADING = "## autotune: confirmation round"


def publish_verdict(study: optuna.Study, line: str) -> None:
    """Store ``line`` (the confirmation round's verdict) as the study's user attribute and,
    where optuna-dashboard is installed and the note is autotune's, as its note."""
    study.set_user_attr(VERDICT_ATTR, line)
    try:
        from optuna_dashboard import get_note, save_note
    except ImportError:
        return
    try:
        current = get_note(study)
    except Exception:  # no note yet: the dashboard's lookup raises on a missing one
        current = ""
    if current and not current.startswith(NOTE_HEADING):
        return
    save_note(study, f"{NOTE_HEADING}\n\n{line}\n")
