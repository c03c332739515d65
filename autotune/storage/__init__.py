"""The shared SQL database: Optuna's tables plus ``measurements`` and ``layout_claims``."""

from __future__ import annotations

from autotune.storage.db import Storage, open_storage
from autotune.storage.urls import mask_url, resolve_url

__all__ = ["Storage", "open_storage", "mask_url", "resolve_url"]
