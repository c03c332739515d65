"""Standard output and error that survive their reader going away.

``autotune run ... | tee run.log`` then Ctrl-C kills ``tee`` with the runner; ``autotune
plan ... | head -1`` closes the pipe after one line. Python ignores SIGPIPE, so the next
``print`` raises :class:`BrokenPipeError`, wherever it happens to be: in the middle of
recording a trial, that exception would end the runner before its interrupt is stored, and
the trial would later be read as a dead runner's. A run's output is a courtesy to its
reader, never a reason to stop, so :func:`survive_closed_pipes` wraps both streams: the
first write error (EPIPE, or any ``OSError`` from a terminal that went away) points the
file descriptor at ``/dev/null`` and every later write succeeds silently, for the rest of
the process. Nothing is written about it: the reader is gone.

>>> import io
>>> class Gone(io.StringIO):
...     def write(self, s: str) -> int:
...         raise BrokenPipeError(32, "Broken pipe")
>>> out = Forgiving(Gone())
>>> out.write("lost"), out.closed_by_reader
(4, True)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["Forgiving", "survive_closed_pipes", "flush_quietly", "closed_pipes_survived"]


class Forgiving:
    """A text stream whose write and flush errors mute it instead of raising."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner
        self.closed_by_reader = False

    def _mute(self) -> None:
        self.closed_by_reader = True
        try:  # later writes, ours and any C-level ones, land in /dev/null
            fd = self._inner.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass  # no descriptor (a test's StringIO): writes are dropped below

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._inner.write(text)
            except (OSError, ValueError):
                self._mute()
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._inner.flush()
                return
            except (OSError, ValueError):
                self._mute()
        try:  # what the buffer still holds goes to /dev/null now
            self._inner.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def survive_closed_pipes() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`Forgiving` (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, Forgiving):
            setattr(sys, name, Forgiving(stream))


def flush_quietly() -> None:
    """Flush both streams now, so that interpreter exit finds nothing to fail on."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


@contextmanager
def closed_pipes_survived() -> Iterator[None]:
    """:func:`survive_closed_pipes` for a command's whole run, flushed at its end."""
    survive_closed_pipes()
    try:
        yield
    finally:
        flush_quietly()
