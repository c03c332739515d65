"""Argument types of the command lines (argparse ``type=`` callables): a refusal names the
value and what is allowed, as every error of autotune does."""

from __future__ import annotations

import argparse

__all__ = ["positive_int"]


def positive_int(text: str) -> int:
    """An integer >= 1.

    >>> positive_int("3")
    3
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an integer >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {value}; allowed: an integer >= 1")
    return value
