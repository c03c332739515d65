"""The program's own error line: what a failed trial's stored reason starts with.

A launcher's summary hides the cause: torchrun ends a failed run with its
``ChildFailedError`` report ("Root Cause (first observed failure): ... traceback : To
enable traceback see ..."), and only the rank's own output says "unrecognized arguments:
--hiden-size", "Dataset does not exist" or the RuntimeError. :func:`program_error_line`
finds, in a rank's output (the per-rank error files first, then the launch's stderr), the
last line that is

* an ``argparse`` error, ``PROG: error: MESSAGE`` (CPython ``Lib/argparse.py``,
  ``ArgumentParser.error``: ``'%(prog)s: error: %(message)s\\n'``), or
* the last line of a Python traceback, ``module.Class: message`` after a ``Traceback``
  header (CPython ``Lib/traceback.py``, ``TracebackException.format_exception_only``),

leaving out the launchers' own exceptions (:data:`LAUNCHER_EXCEPTIONS`). The trial's full
logs stay in its folder; :func:`signature` is the line with what varies between layouts
(numbers, addresses, paths of trial folders) taken out, so that two layouts that failed
alike compare equal (:mod:`autotune.runner.stop_early`).

>>> program_error_line("x\\nTraceback (most recent call last):\\n  File ...\\n"
...                    "ValueError: bad\\ntorch.distributed.elastic.multiprocessing.errors"
...                    ".ChildFailedError: \\n")
'ValueError: bad'
>>> program_error_line("usage: pretrain_gpt.py [-h]\\n"
...                    "pretrain_gpt.py: error: unrecognized arguments: --hiden-size 64")
'pretrain_gpt.py: error: unrecognized arguments: --hiden-size 64'
>>> signature("[rank1]: RuntimeError: shape [4, 64] at 0x7f00ab is invalid")
'RuntimeError: shape [#, #] at # is invalid'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["program_error_line", "signature", "LAUNCHER_EXCEPTIONS"]

LAUNCHER_EXCEPTIONS: tuple[str, ...] = (
    "ChildFailedError",  # torch/distributed/elastic/multiprocessing/errors/__init__.py
    "SignalException",  # torch/distributed/elastic/multiprocessing/api.py (a kill's echo)
    "CalledProcessError",  # a launcher script's subprocess.check_call of the ranks
    "KeyboardInterrupt",
)
"""Exceptions of the launchers around the program, never its own cause."""

_RANK_PREFIX = re.compile(r"^(?:\[(?:rank|default)?\d+\]: ?|\d+: )")
"""torchrun's rank prefix ``[rank0]: ``, srun's ``--label`` ``0: `` (one space only: the
indentation after it tells a traceback's frames from its exception)."""
_ARGPARSE = re.compile(r"^\S+: error: .+")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Failure|"
                        r"Interrupt|Warning)?(?::.*)?$")
_TRACEBACK = "Traceback (most recent call last):"
_MAX_CHARS = 500


def _lines(text: str) -> list[str]:
    return [_RANK_PREFIX.sub("", line).rstrip() for line in text.splitlines()]


def _last_error(text: str) -> str | None:
    found: str | None = None
    in_traceback = False
    for line in _lines(text):
        if line.startswith(_TRACEBACK):
            in_traceback = True
            continue
        if _ARGPARSE.match(line):
            found = line
            in_traceback = False
            continue
        if in_traceback and line and not line.startswith((" ", "\t")):
            # The first unindented line after the frames is the exception.
            in_traceback = False
            name = line.split(":", 1)[0]
            if _EXCEPTION.match(line) and not any(n in name for n in LAUNCHER_EXCEPTIONS):
                found = line
    return found[:_MAX_CHARS] if found else None


def program_error_line(*texts: str | Iterable[str]) -> str | None:
    """The program's own last error line in the first of ``texts`` that has one (each a
    text, or several texts read as one: e.g. every rank's error file), or ``None``."""
    for text in texts:
        joined = text if isinstance(text, str) else "\n".join(text)
        line = _last_error(joined)
        if line:
            return line
    return None


_VARYING = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")
_TRIAL_DIR = re.compile(r"\S*trial-\d+-\S*")


def signature(line: str) -> str:
    """``line`` without what differs between layouts of one failure (module docstring)."""
    line = _RANK_PREFIX.sub("", line.strip())
    return _VARYING.sub("#", _TRIAL_DIR.sub("<trial>", line))[:_MAX_CHARS]
