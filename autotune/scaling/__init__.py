"""Scaling studies: one study file tuned at several world sizes, weak or
strong, each size its own study in one database; the table of the best layout per size,
measured beside predicted, its CSV and plot (``docs/scaling.md``).

* :mod:`autotune.scaling.sizes`: the request (sizes, mode, axis) and each size's spec;
* :mod:`autotune.scaling.run`: running the sizes in order, resumably;
* :mod:`autotune.scaling.table`: the measured and predicted rows, text, CSV;
* :mod:`autotune.scaling.plot`: the PNG.
"""

from autotune.scaling.sizes import ScalingRequest, parse_sizes, size_spec

__all__ = ["ScalingRequest", "parse_sizes", "size_spec"]
