"""The cost model as a strategy's prior: a ``predict(layout) -> model TFLOPS`` callable."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.layout import Layout
from autotune.search._base import Predictor

if TYPE_CHECKING:
    from autotune.models.profile import LayerProfile

__all__ = ["cost_model_predictor"]


def cost_model_predictor(model: ModelConfig, cluster: ClusterConfig, *,
                         dtype: str = "bf16", profile: LayerProfile | None = None,
                         known: Mapping[Layout, float] | None = None,
                         stack: str = "deepspeed") -> Predictor:
    """Predicted model TFLOPS per device of a layout, from :mod:`autotune.models.cost`
    (with ``profile``'s measured layer times where it has them).

    Memoised per layout: strategies ask for every candidate, sometimes more than once.
    ``known``: the same predictions already made (the ranked candidates'
    ``predicted_tflops``, :func:`autotune.planning.candidates.rank_layouts`), so that a
    worker does not estimate every layout of its space twice at start.
    """
    from autotune.models.cost import estimate_step  # local: the search imports light

    cache: dict[Layout, float] = dict(known or {})

    def predict(layout: Layout) -> float:
        if layout not in cache:
            cache[layout] = estimate_step(model, layout, cluster, dtype=dtype,
                                          profile=profile,
                                          stack=stack).model_tflops_per_device
        return cache[layout]

    return predict
