"""Write autotune's metrics file from your own training program: one JSON line per step.

Standard library only, and nothing of autotune is imported: copy this file next to your
program (``examples/deepspeed_gpt/autotune_metrics.py`` is such a copy) or import it as
``autotune.metrics_writer``. The contract it writes (``docs/own-command.md``):

* autotune gives every trial the path in the environment variable ``AUTOTUNE_METRICS_FILE``;
* one JSON object per line, one line per optimizer step, in order::

      {"step": 3, "seconds": 0.412, "tokens": 8192, "peak_memory_bytes": 41234567, "loss": 5.53}

  ``step`` (an integer >= 0) and ``seconds`` (the step's wall time, > 0) are required; the
  rest is optional. Time a step between two synchronisation points of all ranks (a device
  synchronise and a barrier), so that it lasts until the slowest rank is done;
* one rank writes (by default rank 0: ``RANK``, ``SLURM_PROCID``, ``PMI_RANK``), the others
  do nothing. Without the variable the writer does nothing at all, so the program runs
  unchanged outside autotune.

autotune drops the warm-up steps itself and takes the median of the others; a line it
cannot read is skipped and counted, never fatal.

>>> import os, tempfile, json
>>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
>>> with MetricsWriter(path, rank=0) as m:
...     m.step(1, 0.5, loss=5.5)
>>> json.loads(open(path).read())
{'step': 1, 'seconds': 0.5, 'loss': 5.5}
>>> MetricsWriter(path, rank=1).enabled  # not the writing rank
False
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

__all__ = ["ENV_VAR", "MetricsWriter", "rank_from_env"]

ENV_VAR = "AUTOTUNE_METRICS_FILE"
"""The environment variable that holds the metrics file's path."""
_RANK_VARS = ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")


def rank_from_env(env: Any = None) -> int:
    """This process's global rank as its launcher told it (0 when it told nothing)."""
    env = os.environ if env is None else env
    for name in _RANK_VARS:
        value = env.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


class MetricsWriter:
    """Appends one line per step to the metrics file (a no-op where nothing should be
    written: no path given and none in the environment, or not the writing rank)."""

    def __init__(self, path: str | None = None, *, rank: int | None = None,
                 writing_rank: int = 0) -> None:
        self.path = path if path is not None else os.environ.get(ENV_VAR) or None
        self.rank = rank_from_env() if rank is None else rank
        self.enabled = self.path is not None and self.rank == writing_rank
        self._fh: Any = None

    def step(self, step: int, seconds: float, *, tokens: int | None = None,
             peak_memory_bytes: int | None = None, loss: float | None = None,
             **extra: Any) -> None:
        """Record one optimizer step (``seconds``: its wall time)."""
        if not self.enabled or self.path is None:
            return
        line: dict[str, Any] = {"step": int(step), "seconds": float(seconds)}
        for key, value in (("tokens", tokens), ("peak_memory_bytes", peak_memory_bytes),
                           ("loss", loss)):
            if value is not None:
                line[key] = value
        line.update(extra)
        if isinstance(line.get("loss"), float) and not math.isfinite(line["loss"]):
            line["loss"] = None  # JSON has no NaN; a diverged loss is still a timed step
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")  # kept open: one line a step
        self._fh.write(json.dumps(line) + "\n")
        self._fh.flush()  # autotune watches the file for progress

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
