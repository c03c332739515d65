"""Shared fixtures: a small synthetic landscape and the benchmark modules."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

from autotune.config.cluster import ClusterConfig
from autotune.config.model import MODEL_PRESETS
from autotune.landscape import LandscapeGroup, Measurement
from autotune.layout import Layout

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def synthetic_group(n_good: int = 1, *, oom_mb: int | None = None) -> LandscapeGroup:
    """8 devices, global batch 16: tp x pp x micro-batch x recompute (up to 40 layouts).
    Throughput rises with micro-batch and falls with tp and pp; the ``n_good`` fastest
    are within 1% of each other. ``oom_mb``: micro-batches >= it run out of memory."""
    rows = []
    for tp, pp, mb, rc in itertools.product((1, 2, 4), (1, 2), (1, 2, 4, 8), ("none", "full")):
        dp = 8 // (tp * pp)
        if 16 % (dp * mb):
            continue
        lay = Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=16 // (dp * mb),
                     recompute=rc)
        value = 100.0 * mb**0.3 / (tp**0.5 * pp**0.4) * (0.8 if rc == "full" else 1.0)
        if oom_mb is not None and mb >= oom_mb and rc == "none":
            rows.append(Measurement(lay, "oom", None, None))
        else:
            rows.append(Measurement(lay, "ok", value, None))
    ok = sorted((m for m in rows if m.status == "ok"), key=lambda m: -m.model_tflops_per_device)
    top = ok[0].model_tflops_per_device
    bumped = {m.layout: top * 0.995 for m in ok[1:n_good]}
    cut = {m.layout: min(m.model_tflops_per_device, top * 0.9) for m in ok[n_good:]}
    rows = [Measurement(m.layout, m.status,
                        bumped.get(m.layout, cut.get(m.layout, m.model_tflops_per_device)),
                        None) for m in rows]
    return LandscapeGroup("synthetic", MODEL_PRESETS["tiny"],
                          ClusterConfig(nodes=1, devices_per_node=8), 16, "fp32", tuple(rows))


@pytest.fixture
def group() -> LandscapeGroup:
    return synthetic_group()


def load_benchmark(name: str):
    """``benchmarks/NAME.py`` as a module (the scripts are no package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench():
    return load_benchmark("search_efficiency")


@pytest.fixture(scope="session")
def accuracy():
    return load_benchmark("cost_model_accuracy")
