"""A launch held open after its batch: the runner's next word, in the same processes.

``python -m trainer --spec S --result R [...] --hold WORD.json --hold-s SECONDS``: once the
batch's last trial has written its result (and no failure ended the batch early: after an
``error`` the process group may be wedged, so such a launch ends as before), the ranks
stay up and wait for ``WORD.json``, which the runner writes atomically:

* ``{"rotation": "SCHEDULE.json"}``: the confirmation round (:mod:`trainer.rotation`)
  runs here, on the groups the batch already opened: the processes' start, the imports
  and the rendezvous, most of a launch's cost on a small model, are not paid again;
* ``{"exit": true}``: the launch ends at once, as it would have without ``--hold``.

No word within ``SECONDS`` (a runner killed meanwhile, or one whose round went to another
worker): the launch ends by itself, so that nothing is held for long. Rank 0 alone reads
the file; every rank takes its answer each poll (a broadcast over the status group, whose
timeout the short polls never approach), so that all of them rotate or leave together.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainer.launch import LaunchContext, rank0_value

__all__ = ["await_word", "POLL_S", "EXIT", "ROTATION", "NOTHING"]

POLL_S = 0.1
"""How often rank 0 looks for the word (a broadcast each time: microseconds on gloo)."""
NOTHING, EXIT, ROTATION = 0.0, 1.0, 2.0


def _read(path: Path) -> tuple[float, str | None]:
    try:
        word: Any = json.loads(path.read_text())
    except FileNotFoundError:
        return NOTHING, None
    except (OSError, ValueError):
        return NOTHING, None  # not whole yet (it is written atomically: never, in practice)
    if isinstance(word, dict) and isinstance(word.get("rotation"), str):
        return ROTATION, word["rotation"]
    return EXIT, None  # {"exit": true}, or anything this version does not know: leave


def await_word(path: str, ctx: LaunchContext, limit_s: float) -> str | None:
    """Wait for the runner's word (module docstring); the rotation schedule's path, or
    ``None``: end the launch (asked to, or no word within ``limit_s``)."""
    rank = ctx.launch.rank
    word = Path(path)
    deadline = time.monotonic() + limit_s
    schedule: str | None = None
    while True:
        found, schedule = _read(word) if rank == 0 else (NOTHING, None)
        if rank == 0 and found == NOTHING and time.monotonic() > deadline:
            found = EXIT
        agreed = rank0_value(found, ctx, True)
        if agreed == EXIT:
            return None
        if agreed == ROTATION:
            return _rank0_text(schedule, ctx)
        time.sleep(POLL_S)


def _rank0_text(text: str | None, ctx: LaunchContext) -> str | None:
    """Rank 0's ``text`` on every rank (the schedule's path: read once, by rank 0)."""
    if ctx.launch.world_size == 1:
        return text
    import torch.distributed as dist

    box: list[Any] = [text]
    dist.broadcast_object_list(box, src=0, group=ctx.status_group)
    return box[0]
