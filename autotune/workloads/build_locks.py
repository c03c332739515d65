"""Build locks a killed program left behind: why every later trial stops before its first step.

PyTorch's JIT extension build (``torch.utils.cpp_extension.load``, which DeepSpeed's op
builders call from ``OpBuilder.jit_load``: on CPU, ``deepspeed.comm.torch.build_shm_op``
in every plain DeepSpeed program's ``init_distributed``) takes a lock file
``<root>/<extension>/lock`` around the build (``torch.utils.file_baton.FileBaton``: created
with ``O_CREAT | O_EXCL``, removed when the build ends). Every other process that loads the
extension meanwhile waits for the file to go, with no time limit (``FileBaton.wait``). A
program killed during the build (a timeout, autotune's no-progress stop) never removes it,
and from then on every DeepSpeed program of that user on that file system waits before its
first step: each trial of a study is killed in turn after ``workload.startup_s``.

autotune cannot tell a stale lock from a build in progress (the file holds no owner), so it
deletes nothing; when a trial made no first step, its reason names the lock files older than
the trial (:func:`stale_build_locks`), which is what the user needs to delete.

The root is ``TORCH_EXTENSIONS_DIR`` when set (one folder per extension under it), else
torch's ``get_default_build_root()`` (``~/.cache/torch_extensions``, one folder per Python
and accelerator, e.g. ``py311_cpu``, then one per extension).

>>> import os, tempfile, time
>>> root = tempfile.mkdtemp()
>>> os.makedirs(os.path.join(root, "deepspeed_shm_comm"))
>>> open(os.path.join(root, "deepspeed_shm_comm", "lock"), "w").close()
>>> [p.name for p in stale_build_locks({"TORCH_EXTENSIONS_DIR": root}, before=time.time() + 10)]
['lock']
>>> stale_build_locks({"TORCH_EXTENSIONS_DIR": root}, before=time.time() - 3600)
[]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CLOCK_SLACK_S", "extension_roots", "stale_build_locks", "stale_lock_hint"]

# How much older than the trial a lock must be to be named. Linux stamps a file from its
# coarse clock, up to a tick behind the time.time() the trial started at, so a lock created
# just after the start can read as older (seen in CI on a loaded machine); a network file
# system stamps with the server's clock, which may differ by a second. A lock a killed build
# left is older than that by minutes.
CLOCK_SLACK_S = 2.0


def extension_roots(env: Mapping[str, str]) -> list[Path]:
    """The folders torch builds JIT extensions under for a process with environment ``env``
    (``torch.utils.cpp_extension._get_build_directory``)."""
    chosen = env.get("TORCH_EXTENSIONS_DIR")
    if chosen:
        return [Path(chosen)]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or "~", ".cache")
    return [Path(os.path.expanduser(cache)) / "torch_extensions"]


def stale_build_locks(env: Mapping[str, str], *, before: float) -> list[Path]:
    """The build lock files under ``env``'s extension roots last touched more than
    :data:`CLOCK_SLACK_S` before ``before`` (a time.time() value: the trial's start), at the
    depths torch puts them."""
    found: list[Path] = []
    cutoff = before - CLOCK_SLACK_S
    for root in extension_roots(env):
        for pattern in ("*/lock", "*/*/lock"):
            try:
                found += [p for p in root.glob(pattern) if p.stat().st_mtime < cutoff]
            except OSError:
                continue  # a root that is not there, or went while it was read
    return sorted(set(found))


def stale_lock_hint(env: Mapping[str, str], *, before: float) -> str:
    """What a trial with no first step adds to its reason when build locks older than it
    exist ('' when none)."""
    locks = stale_build_locks(env, before=before)
    if not locks:
        return ""
    shown = ", ".join(str(p) for p in locks[:3]) + (" ..." if len(locks) > 3 else "")
    return (f"; torch's extension build lock {shown} is older than this trial: a build killed "
            "mid-way leaves it, and every later DeepSpeed program waits on it before its "
            "first step. Delete it if no build is running")
