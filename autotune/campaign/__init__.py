"""SLURM campaigns: many studies, one shared database, job arrays of workers.

* :mod:`~autotune.campaign.config`: the campaign file, validated (``load_campaign``).
* :mod:`~autotune.campaign.render`: the on-disk layout, study documents and sbatch scripts.
* :mod:`~autotune.campaign.jobs`: submission (idempotent), budget check, status.
* :mod:`~autotune.campaign.cli`: ``autotune campaign submit|status|check``.

See ``docs/hpc.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CampaignSpec", "CampaignPaths", "load_campaign", "render_script", "status",
           "submit"]

_WHERE = {"CampaignSpec": "config", "load_campaign": "config", "status": "jobs",
          "submit": "jobs", "CampaignPaths": "render", "render_script": "render"}


def __getattr__(name: str) -> Any:
    """Lazy: ``autotune --help`` and every other command import the campaign parser, not
    the campaign machinery (SQLAlchemy, the study loader) behind it."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"autotune.campaign.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'autotune.campaign' has no attribute {name!r}")
