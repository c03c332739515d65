"""What a scaling study is: the sizes, weak or strong, and the study each size runs.

A scaling study tunes one study file at several world sizes (``docs/scaling.md``):

* ``--nodes 1,2,4``: ``cluster.nodes`` takes each value (``devices_per_node`` stays);
  ``--devices 1,2,4``: one node, ``devices_per_node`` takes each value (the ranks of one
  machine);
* **weak**: the per-device work is fixed, so the global batch grows with the size: at size
  ``N`` it is ``training.global_batch * N / S``, ``S`` being the study file's own size
  (its ``cluster.nodes``, or ``devices_per_node`` with ``--devices``), i.e. the file's
  batch is its cluster's; **strong**: the global batch is the file's at every size.
* Each size is its own study in the same database, named ``NAME-nN-gbB`` (``-dN-gbB``
  with ``--devices``; ``B`` the size's global batch), so that a second run resumes each
  where it stopped and a size already done is not measured again. A study is what it
  measures (model, world size, batch), not the mode that asked for it: the study file's
  own size has the same batch weak or strong, so a strong run after a weak one reuses
  that size's study.

Efficiency against the smallest size ``N0`` (:func:`scaling_efficiency`) is the same
formula in both modes: per-device throughput at ``N`` over that at ``N0``. Weak: the
tokens per second per device are constant under perfect scaling; strong: the speed-up
``T(N)/T(N0)`` over the ideal ``N/N0``, which is the same ratio written per device
(Hoefler and Belli, "Scientific benchmarking of parallel computing systems", SC'15,
rule 11: report speed-up and efficiency against a named base).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.config.cluster import MAX_DEVICES_PER_NODE, MAX_NODES
from autotune.errors import SpecError
from autotune.spec import StudySpec

__all__ = ["MODES", "AXES", "ScalingRequest", "parse_sizes", "size_spec", "size_study_name",
           "scaling_efficiency", "default_sizes"]

MODES: tuple[str, ...] = ("weak", "strong")
AXES: tuple[str, ...] = ("nodes", "devices")


def parse_sizes(text: str, *, flag: str = "--nodes") -> tuple[int, ...]:
    """``1,2,4`` as sorted distinct sizes >= 1 (a usage error naming the flag otherwise)."""
    top = MAX_NODES if flag == "--nodes" else MAX_DEVICES_PER_NODE
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        values = ()
    if not values or values[0] < 1 or values[-1] > top:
        raise SpecError(flag, text, f"allowed: a comma-separated list of sizes 1-{top}, "
                        "e.g. 1,2,4")
    return values


@dataclass(frozen=True)
class ScalingRequest:
    """The sizes of one scaling study and how the batch follows them."""

    mode: str
    axis: str
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecError("--mode", self.mode, f"allowed: one of {', '.join(MODES)}")
        if self.axis not in AXES:
            raise SpecError("axis", self.axis, f"allowed: one of {', '.join(AXES)}")
        if not self.sizes:
            raise SpecError(f"--{self.axis}", "", "allowed: at least one size")

    @property
    def base(self) -> int:
        """The smallest size: what efficiency is measured against."""
        return self.sizes[0]

    def file_size(self, spec: StudySpec) -> int:
        """The study file's own size along the axis (its batch is that size's)."""
        return spec.cluster.nodes if self.axis == "nodes" else spec.cluster.devices_per_node

    def devices(self, spec: StudySpec, size: int) -> int:
        return size * (spec.cluster.devices_per_node if self.axis == "nodes" else 1)

    def global_batch(self, spec: StudySpec, size: int) -> int:
        """The size's global batch (module docstring): fixed (strong) or proportional."""
        batch = spec.training.global_batch
        if self.mode == "strong":
            return batch
        scaled, rest = divmod(batch * size, self.file_size(spec))
        if rest:
            raise SpecError("training.global_batch", batch,
                            f"allowed (weak scaling): a multiple of {self.file_size(spec)} "
                            f"(the study's {self.axis}) so that size {size} gets a whole "
                            f"batch ({batch} x {size} / {self.file_size(spec)} is not one)")
        return scaled


def size_study_name(spec: StudySpec, request: ScalingRequest, size: int) -> str:
    """``NAME-n4-gb16`` / ``NAME-d2-gb8``: the study of one size (module docstring)."""
    letter = "n" if request.axis == "nodes" else "d"
    name = f"{spec.name}-{letter}{size}-gb{request.global_batch(spec, size)}"
    if len(name) > 100:
        raise SpecError("name", spec.name, "allowed for a scaling study: at most "
                        f"{100 - len(name) + len(spec.name)} characters (the size's study "
                        f"name {name[:40]}... must fit in 100)")
    return name


def size_spec(spec: StudySpec, request: ScalingRequest, size: int) -> StudySpec:
    """The study file's spec at one size: its cluster, batch and study name."""
    if request.axis == "nodes":
        cluster = replace(spec.cluster, nodes=size)
    else:
        cluster = replace(spec.cluster, nodes=1, devices_per_node=size)
    return replace(spec, name=size_study_name(spec, request, size), cluster=cluster,
                   training=replace(spec.training,
                                    global_batch=request.global_batch(spec, size)))


def default_sizes(spec: StudySpec, axis: str) -> tuple[int, ...]:
    """1, 2, 4, ... up to the study's cluster, and the cluster's size itself.

    >>> from autotune.spec import parse_study
    >>> s = parse_study({"model": {"preset": "gpt-175b"}, "training": {"global_batch": 1536},
    ...                  "cluster": {"nodes": 96, "devices_per_node": 8,
    ...                              "device": "max1550-tile"}})
    >>> default_sizes(s, "nodes")
    (1, 2, 4, 8, 16, 32, 64, 96)
    """
    top = spec.cluster.nodes if axis == "nodes" else spec.cluster.devices_per_node
    sizes, n = {top}, 1
    while n < top:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


def scaling_efficiency(per_device: float, base_per_device: float) -> float:
    """Per-device throughput at a size over that at the base size (module docstring).

    >>> scaling_efficiency(0.93, 1.0)
    0.93
    """
    return per_device / base_per_device
