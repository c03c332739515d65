"""Typed, validated configuration: one dataclass per concern.

Raw mappings (YAML, JSON) are turned into these objects by :mod:`autotune.spec` and by
``from_dict`` constructors; nothing downstream ever sees a raw dict.
"""

from __future__ import annotations

from autotune.config.cluster import ClusterConfig, LinkConfig
from autotune.config.model import MODEL_PRESETS, ModelConfig

__all__ = ["ClusterConfig", "LinkConfig", "MODEL_PRESETS", "ModelConfig"]
