"""SLURM campaigns: many studies, one shared database, job arrays of workers.

* :mod:`~autotune.campaign.config`: the campaign file, validated (``load_campaign``).
* :mod:`~autotune.campaign.render`: the on-disk layout, study documents and sbatch scripts.
* :mod:`~autotune.campaign.jobs`: submission (idempotent), budget check, status.
* :mod:`~autotune.campaign.cli`: ``autotune campaign submit|status|check``.

See ``docs/hpc.md``.
"""

from __future__ import annotations

from autotune.campaign.config import CampaignSpec, load_campaign
from autotune.campaign.jobs import status, submit
from autotune.campaign.render import CampaignPaths, render_script

__all__ = ["CampaignSpec", "CampaignPaths", "load_campaign", "render_script", "status",
           "submit"]
