"""A rank's status in the result file (``ok``, ``oom``, ``error``) from how its trial
ended: the one place an exception becomes a status (:mod:`trainer.run` agrees on it
across ranks)."""

from __future__ import annotations

__all__ = ["STATUS_CODES", "Terminated", "is_out_of_memory", "result_status_of_exception"]

STATUS_CODES = {"ok": 0, "oom": 1, "error": 2}
_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory",
                "failed to allocate")


class Terminated(Exception):
    """SIGTERM arrived (torchrun stops the other ranks when one fails)."""


def is_out_of_memory(err: BaseException) -> bool:
    """True for allocator failures on any device (CUDA/XPU OOM, host ``ENOMEM``)."""
    if isinstance(err, MemoryError):
        return True
    name = type(err).__name__
    if name == "OutOfMemoryError":  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _OOM_MARKERS)


def result_status_of_exception(err: BaseException | None) -> str:
    """The result-file status (:data:`STATUS_CODES`) of a rank whose trial ended with
    ``err`` (``None``: it finished): ``oom`` for an allocator failure, else ``error``."""
    if err is None:
        return "ok"
    return "oom" if is_out_of_memory(err) else "error"
