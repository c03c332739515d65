"""The ``zero_variant`` column of a measured table (``data/landscapes/aurora_pvc_70b.csv``)
read onto the layout's ZeRO-3 variant axis (:attr:`autotune.layout.Layout.zero_variant`).

Values: empty or ``none`` (plain ZeRO), ``mics`` or ``hpz`` with the shard / partition size
appended (``hpz12``). The Aurora notes give ``mics`` without its shard size; ALCF's MiCS
runs shard within a node (the size that keeps MiCS's gathers on the node's fabric, Zhang
et al. 2022, section 3.1), so a bare variant takes the devices of a node, as a study's
``search.zero_shard_size`` does by default.

>>> zero_variant_of("hpz12", devices_per_node=12), zero_variant_of("mics", 12)
(('hpz', 12), ('mics', 12))
>>> zero_variant_of("", 12)
('none', 1)
"""

from __future__ import annotations

import re

__all__ = ["zero_variant_of", "ZERO_VARIANT_FORM"]

ZERO_VARIANT_FORM = "allowed: empty, 'none', 'mics[N]' or 'hpz[N]' (N: the shard size)"
_PATTERN = re.compile(r"(mics|hpz)(\d*)")


def zero_variant_of(text: str, devices_per_node: int) -> tuple[str, int]:
    """``(variant, shard size)`` of a cell; a :class:`ValueError` for any other text."""
    text = text.strip().lower()
    if text in ("", "none"):
        return "none", 1
    match = _PATTERN.fullmatch(text)
    if match is None:
        raise ValueError(text)
    return match.group(1), int(match.group(2)) if match.group(2) else devices_per_node
