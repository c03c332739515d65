"""A stored reason's text cut to its limit without cutting a word.

A trial's reason (a traceback tail, a launcher's message) is stored as its last
characters: the end of a traceback says what went wrong. Cut at a fixed count it started
mid-word (``RM?); 8 step(s) ...``); :func:`tail_at_word` starts it at the first word
boundary inside the limit and marks the cut with an ellipsis.

>>> tail_at_word("an error in the trainer", 12)
'… trainer'
>>> tail_at_word("short", 12)
'short'
"""

from __future__ import annotations

__all__ = ["tail_at_word"]

ELLIPSIS = "…"


def tail_at_word(text: str, limit: int) -> str:
    """The end of ``text`` in at most ``limit`` characters, ellipsis included; cut at a
    whitespace (a single word longer than the limit is cut where it must be)."""
    if len(text) <= limit:
        return text
    tail = text[len(text) - (limit - 2):]  # room for the ellipsis and its space
    for i, ch in enumerate(tail):
        if ch.isspace():
            rest = tail[i:].lstrip()
            if rest:
                return f"{ELLIPSIS} {rest}"
            break
    return f"{ELLIPSIS} {tail.lstrip()}"
