"""The cost model as a strategy's prior: a ``predict(layout) -> model TFLOPS`` callable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.search._base import Predictor

if TYPE_CHECKING:
    from autotune.models.profile import LayerProfile

__all__ = ["cost_model_predictor"]


def cost_model_predictor(model: ModelConfig, cluster: ClusterConfig, *,
                         dtype: str = "bf16", profile: LayerProfile | None = None) -> Predictor:
    """Predicted model TFLOPS per device of a layout, from :mod:`autotune.models.cost`
    (with ``profile``'s measured layer times where it has them).

    Memoised per layout: strategies ask for every candidate, sometimes more than once.
    """
    from autotune.models.cost import estimate_step  # local: the search imports light

    cache: dict[Layout, float] = {}

    def predict(layout: Layout) -> float:
        if layout not in cache:
            cache[layout] = estimate_step(model, layout, cluster, dtype=dtype,
                                          profile=profile).model_tflops_per_device
        return cache[layout]

    return predict
