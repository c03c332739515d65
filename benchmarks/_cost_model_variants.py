"""The cost model the benchmarks predict with when it is not the analytic one: made wrong on
purpose, or given layer times measured on other groups.

* :func:`with_error` (``--cost-model-error``; :func:`perturbed`): the cost model made wrong
  about whole axes, to see what the search and the online calibration do where the model
  is not this good; :func:`wrong_links` (``--link-factor``): wrong about the interconnect.
* :func:`held_out_profiles` (``--profile-cv``, :func:`add_profile_cv_argument`,
  :func:`parse_profile_cv`): for each group, a layer profile fitted only on groups of
  another layer count, device count or global batch (handed to the cost model as
  ``profile=``; the cluster names a profile's path only).
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from autotune.config.cluster import ClusterConfig
from autotune.hardware import get_device
from autotune.landscape import LandscapeGroup
from autotune.layout import Layout
from autotune.models.profile import LayerProfile
from autotune.models.profile_fit import fit_layer_profile, landscape_samples
from autotune.search import Predictor
from benchmarks._common import candidates_of

__all__ = ["CV_SCHEMES", "add_profile_cv_argument", "held_out_profiles", "parse_profile_cv",
           "perturbed", "with_error", "wrong_links"]

# ------------------------------------------------------- a deliberately wrong cost model


def perturbed(predict: Predictor, layouts: list[Layout], sd: float, seed: str) -> Predictor:
    """``predict`` times ``exp(N(0, sd^2))`` per axis value (tp=4, recompute=full, ...):
    a cost model that is wrong about whole axes, as real ones are (docs/models.md)."""
    rng = random.Random(seed)  # a str seed hashes the same in every process
    factor = {(a, v): math.exp(rng.gauss(0.0, sd)) for a in Layout.SEARCH_AXES
              for v in sorted({getattr(lay, a) for lay in layouts}, key=str)}
    return lambda lay: predict(lay) * math.prod(factor[a, v] for a, v in lay.params().items())


def wrong_links(cluster: ClusterConfig, factor: float) -> ClusterConfig:
    """``cluster`` told that every link (within a card, within a node, between nodes) has
    ``factor`` times its real bandwidth (the device's table figures): a cost model wrong
    about the interconnect, as one is with a mis-set ``cluster.links`` (0.25: it thinks
    NVLink four times slower, so it overrates pipelines and underrates tensor parallelism)."""
    dev = get_device(cluster.device)
    return replace(cluster, links=replace(
        cluster.links, intra_card_gbps=dev.intra_card.gbps * factor,
        intra_node_gbps=dev.intra_node.gbps * factor,
        inter_node_gbps=dev.inter_node.gbps * factor))


def with_error(predict: Predictor, group: LandscapeGroup, sd: float, draw: int) -> Predictor:
    """``predict`` itself when ``sd`` is 0, else its :func:`perturbed` draw ``draw`` for
    ``group`` (the same draw for every strategy and replay that asks for it)."""
    if sd <= 0:
        return predict
    return perturbed(predict, candidates_of(group), sd, f"{group.name}/{draw}")


# ----------------------------------------------------------------- held-out layer profiles

CV_SCHEMES: dict[str, Callable[[LandscapeGroup], int]] = {
    "layers": lambda g: g.model.n_layer,
    "world": lambda g: g.world_size,
    "batch": lambda g: g.global_batch,
}
"""Cross-validation schemes of measured layer profiles: the key whose every value is held
out in turn. Each is a situation a user is in: profiles from shallower or deeper models of
the same width (``layers``), from other device counts (``world``), from other global
batches (``batch``)."""


def parse_profile_cv(values: Sequence[str]) -> list[str]:
    """``--profile-cv`` values (repeated or comma lists) as distinct scheme names, in order;
    :class:`ValueError` names an unknown one."""
    schemes = [v.strip() for value in values for v in value.split(",") if v.strip()]
    for s in schemes:
        if s not in CV_SCHEMES:
            raise ValueError(f"--profile-cv: unknown {s!r}; allowed: {', '.join(CV_SCHEMES)}")
    return list(dict.fromkeys(schemes))


def add_profile_cv_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--profile-cv`` option, the same in both benchmarks."""
    parser.add_argument("--profile-cv", action="append", default=[], metavar="SCHEME",
                        help="also predict with layer profiles fitted on the other groups "
                        f"(held out by: {', '.join(CV_SCHEMES)}; repeatable or a comma list)")


def held_out_profiles(groups: Sequence[LandscapeGroup], scheme: str,
                      fit_on: Sequence[LandscapeGroup] | None = None) -> list[LayerProfile]:
    """For each of ``groups``, the profile fitted on the groups of ``fit_on`` (default:
    ``groups``) whose ``scheme`` key differs from its own: nothing measured in a group, nor
    in any group sharing its key, enters its prediction. One fit per key value."""
    key = CV_SCHEMES[scheme]
    pool = groups if fit_on is None else fit_on
    folds: dict[int, LayerProfile] = {}
    for value in sorted({key(g) for g in groups}):
        folds[value] = fit_layer_profile(
            landscape_samples(g for g in pool if key(g) != value),
            source=f"landscape groups with {scheme} != {value}")
    return [folds[key(g)] for g in groups]
