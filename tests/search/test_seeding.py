"""The strategies' cost-model prior (autotune/search/_seeding.py): the predictions a worker
hands it from its ranked candidates are the ones it would have made itself."""

from __future__ import annotations

from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS
from autotune.config.study import SearchConfig, TrainingConfig, TrialConfig
from autotune.feasibility import Constraints
from autotune.planning.candidates import rank_candidates
from autotune.search import cost_model_predictor


def test_the_candidates_predictions_are_the_predictor_s_own() -> None:
    model = MODEL_PRESETS["gpt-1.3b"]
    cluster = ClusterConfig(nodes=2, devices_per_node=8, device="a100-80gb")
    training = TrainingConfig(global_batch=64, dtype="bf16")
    search = SearchConfig()
    ranked = rank_candidates(model, cluster, training, search,
                             Constraints.from_configs(cluster, training, search, TrialConfig()),
                             profile=None)
    assert len(ranked) > 20
    fresh = cost_model_predictor(model, cluster, dtype="bf16")
    known = {c.layout: c.predicted_tflops for c in ranked}
    seeded = cost_model_predictor(model, cluster, dtype="bf16", known=known)
    for c in ranked:
        assert seeded(c.layout) == fresh(c.layout) == c.predicted_tflops, c.layout
