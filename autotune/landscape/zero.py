"""The ``zero_variant`` column of a measured table (``data/landscapes/aurora_pvc_70b.csv``)
read onto the layout's ZeRO-3 variant axis (:attr:`autotune.layout.Layout.zero_variant`).

Values: empty or ``none`` (plain ZeRO), ``mics`` or ``hpz`` with the shard / partition size
appended (``hpz12``). A size the table leaves out is read as follows:

- bare ``hpz``: the devices of a node, ZeRO++'s secondary partition as Wang et al. 2023
  (section 3.2) place it, and a study's ``search.zero_shard_size`` default;
- bare ``mics``: the whole data-parallel group. The Aurora notes give no MiCS group, and
  what ran rules out a node's: 16 bytes per parameter of a 69 B model over 12 tiles is
  92 GB, beyond a 64 GB tile. The whole group is the only size the table itself vouches
  for (MiCS's partition then equals ZeRO-3's); any other would be invented.

>>> zero_variant_of("hpz12", devices_per_node=12, dp=48), zero_variant_of("mics", 12, 48)
(('hpz', 12), ('mics', 48))
>>> zero_variant_of("", 12, 48), zero_variant_of("hpz", 12, 48)
(('none', 1), ('hpz', 12))
"""

from __future__ import annotations

import re

__all__ = ["zero_variant_of", "ZERO_VARIANT_FORM"]

ZERO_VARIANT_FORM = "allowed: empty, 'none', 'mics[N]' or 'hpz[N]' (N: the shard size)"
_PATTERN = re.compile(r"(mics|hpz)(\d*)")


def zero_variant_of(text: str, devices_per_node: int, dp: int) -> tuple[str, int]:
    """``(variant, shard size)`` of a cell; a :class:`ValueError` for any other text."""
    text = text.strip().lower()
    if text in ("", "none"):
        return "none", 1
    match = _PATTERN.fullmatch(text)
    if match is None:
        raise ValueError(text)
    if match.group(2):
        return match.group(1), int(match.group(2))
    return match.group(1), dp if match.group(1) == "mics" else devices_per_node
