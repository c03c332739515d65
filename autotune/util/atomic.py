"""Atomic file writes: readers see the old file or the whole new one, never a part.

A temporary file beside the target is written, flushed to disk and renamed over the
target (``os.replace`` is atomic on POSIX filesystems). The temporary file is created by
the writer itself so it gets the umask's mode: ``mkstemp``'s 0600 would make results and
reports on a shared project filesystem unreadable to the group.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "write_text_atomic", "write_json_atomic"]


@contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` on success.

    The temporary name keeps the suffix so that writers choosing a format by extension
    (matplotlib's ``savefig``) still do the right thing.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    unique = f"{os.getpid()}.{uuid.uuid4().hex[:8]}"
    tmp = target.parent / f".{target.stem}.{unique}.tmp{target.suffix}"
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename in (str(tmp), tmp):
            # Name the file the caller asked for, not the temporary one beside it.
            raise OSError(err.errno, err.strerror, str(target)) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    with atomic_path(target) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def write_json_atomic(target: str | os.PathLike[str], data: Any) -> None:
    """JSON (strict: no NaN) written atomically."""
    write_text_atomic(target, json.dumps(data, indent=2, allow_nan=False) + "\n")
