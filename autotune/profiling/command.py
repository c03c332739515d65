"""``autotune profile`` end to end: a study's layer shapes measured
(:mod:`autotune.profiling.layers`) or a measured table fitted
(:mod:`autotune.models.profile_fit`), into one profile file.

The file is checked before any run (a file that cannot be extended or written must neither
cost runs nor be replaced), extended rather than replaced (new entries win), and rewritten
atomically after every measured shape, so that a job killed at its time limit keeps what
it finished. Failures that leave nothing to write raise :class:`~autotune.errors.
AutotuneError`; the CLI maps them, and an interrupted run, to exit codes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, SpecError
from autotune.landscape import load_landscape
from autotune.launchers import make_launcher
from autotune.models.profile import LayerProfile, load_profile
from autotune.models.profile_fit import fit_layer_profile, landscape_samples
from autotune.profiling.layers import (
    DEFAULT_ACCUMS,
    DEFAULT_LAYERS,
    ProfileRun,
    check_profilable,
    compare_rows,
    profile_cells,
    render_comparison,
    render_memory_comparison,
    run_profile,
)
from autotune.spec import StudySpec, load_study

__all__ = ["profile_study", "profile_landscape", "writable_profile", "merge_into",
           "relative_to_study"]


def writable_profile(out: Path) -> LayerProfile | None:
    """What ``out`` holds already (``None``: nothing yet), checked before any work: a file
    that cannot be extended or written must neither cost runs nor be replaced."""
    if out.is_dir():
        raise SpecError("--out", str(out), "allowed: a file path (this is a directory)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecError("--out", str(out), f"cannot create its folder ({err.strerror})"
                        ) from None
    if not os.access(out.parent, os.W_OK):
        raise SpecError("--out", str(out), "allowed: a path in a writable folder")
    if not out.exists():
        return None
    try:
        return load_profile(out)
    except SpecError as err:
        raise SpecError("--out", str(out), f"holds no profile to extend: {err}") from None


def merge_into(out: Path, previous: LayerProfile | None, new: LayerProfile) -> LayerProfile:
    """Write ``new`` over ``previous``'s entries (atomically; new entries win); return
    what was written."""
    merged = new if previous is None else previous.merged(new)
    merged.save(out)
    return merged


def relative_to_study(path: Path, spec: StudySpec) -> str:
    """``path`` as the study file should name it: relative to its folder when it can be
    (the loader looks there), else absolute."""
    if spec.source is None:
        return str(path.resolve())
    return os.path.relpath(path.resolve(), Path(spec.source).resolve().parent)


def profile_landscape(csv: str, out: Path, **table: Any) -> LayerProfile:
    """Fit the layer shapes of a measured table (``table``: :func:`autotune.landscape.
    load_landscape`'s options) into ``out``; return what the file holds now."""
    previous = writable_profile(out)
    groups = load_landscape(csv, field="--from-landscape", **table)
    profile = fit_layer_profile(landscape_samples(groups), source=f"landscape {csv}")
    if not len(profile):
        raise AutotuneError(f"{csv}: no series of layouts measured at two or more layer "
                            "counts; nothing to fit")
    written = merge_into(out, previous, profile)
    print(f"wrote {out}: {len(profile)} layer shape(s) fitted, {len(written)} in the file")
    return written


def profile_study(study_file: str, *, out: Path | None = None, top: int | None = None,
                  layers: Sequence[int] | None = None,
                  log: Callable[[str], None] = lambda _line: None) -> ProfileRun:
    """Measure the layer shapes of ``study_file``'s feasible layouts (the ``top`` best
    predicted ones' if given) with its own launcher, into ``out`` (default: the study's
    ``cluster.profile``, else ``profiles/<name>.json``). Prints what was written and the
    comparison with the analytic times; ``log`` gets the progress lines. The returned
    run says whether it was interrupted."""
    # The study's own profile file is what this writes: it may not exist or fit yet.
    spec = load_study(study_file, read_profile=False)
    check_profilable(spec)
    out = out or spec.cluster.profile_path or Path("profiles") / f"{spec.name}.json"
    previous = writable_profile(out)
    launcher = make_launcher(spec.launcher, spec.model, spec.cluster, spec.training,
                             source=spec.source)
    cells, skipped = profile_cells(spec, top=top)
    layers = layers or DEFAULT_LAYERS
    for cell, why in skipped:
        log(f"skipping {cell.label()}: {why}")
    if not cells:
        what = ("every shape's TP group spans nodes" if skipped
                else "the study has no feasible layout (see autotune plan)")
        raise AutotuneError(f"nothing to profile: {what}")
    log(f"{len(cells)} layer shape(s) of {spec.name}: {', '.join(c.label() for c in cells)}; "
        f"{len(cells) * len(layers) * len(DEFAULT_ACCUMS)} runs; writing {out}")
    result = run_profile(spec, launcher, cells, layers=layers, log=log,
                         checkpoint=lambda prof: merge_into(out, previous, prof))
    rows = compare_rows(spec, result.profile, cells)
    if rows:
        # The last checkpoint wrote exactly this.
        in_file = len(result.profile if previous is None else previous.merged(result.profile))
        print(f"wrote {out}: {len(rows)} layer shape(s) measured, {in_file} in the file")
        print(render_comparison(rows))
        memory = render_memory_comparison(rows)
        if memory:
            print("\nbytes per layer (model states + stored activations of one micro-batch; "
                  "peak: the allocator's peak allocated bytes, or the process's peak "
                  "resident set on CPU); activations = measured less the analytic states:")
            print(memory)
        no_memory = [r.cell.label() for r in rows if r.entry.memory is None]
        if no_memory:
            print(f"no bytes per layer for: {', '.join(no_memory)} (the peak did not grow "
                  "with the layers above the noise); the memory model keeps its count")
        noisy = [r.cell.label() for r in rows if r.entry.noisy]
        if noisy:
            print(f"noisy (error over 10%): {', '.join(noisy)}; more trial.measure_steps or "
                  "a wider --layers gap would tighten them")
        if spec.cluster.profile_path != out:
            print(f"use it: in {study_file}, cluster:  profile: {relative_to_study(out, spec)}")
    for cell, why in sorted(result.failed.items()):
        print(f"not measured: {cell.label()}: {why}", file=sys.stderr)
    if not rows and not result.interrupted:
        raise AutotuneError("no layer shape could be measured")
    return result
