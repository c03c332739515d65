"""autotune: find the fastest 3D-parallel layout of a GPT training job.

An Optuna study proposes layouts (:mod:`autotune.search`), the one feasibility check
(:mod:`autotune.feasibility`) rejects those that cannot run, a launcher
(:mod:`autotune.launchers`) runs a short DeepSpeed trial of :mod:`trainer`, and every
measurement lands in a SQL database (:mod:`autotune.storage`).
"""

from __future__ import annotations

__version__ = "0.1.0"
