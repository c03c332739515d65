"""A trial that makes no first step because a killed build left torch's lock behind says so
(autotune/workloads/build_locks.py): the lock is torch's own ``FileBaton``, the waiting
program a real ``torch.utils.cpp_extension``-style wait, the trial a real local launch."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from autotune.config.cluster import ClusterConfig
from autotune.config.model import ModelConfig
from autotune.config.workload import WorkloadConfig
from autotune.launchers.local import LocalLauncher
from autotune.layout import Layout
from autotune.trial import RunConfig, TrialPaths, TrialSpec
from autotune.trial.classify import classify
from autotune.workloads.base import ProgressWatch
from autotune.workloads.build_locks import stale_build_locks
from autotune.workloads.foreign import CommandWorkload

# Waits on the extension's lock as torch.utils.cpp_extension._jit_compile does when another
# process holds it (FileBaton.wait: no time limit), then would train.
_WAITER = """
import os, sys
from torch.utils.file_baton import FileBaton
baton = FileBaton(os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "my_op", "lock"))
if baton.try_acquire():
    baton.release()
else:
    baton.wait()
"""


class _NoSteps:
    steps = 0

    def update(self) -> bool:
        return False


def test_the_default_root_is_torchs(tmp_path: Path) -> None:
    from torch.utils.cpp_extension import get_default_build_root

    from autotune.workloads.build_locks import extension_roots

    assert extension_roots(os.environ if "TORCH_EXTENSIONS_DIR" not in os.environ
                           else {k: v for k, v in os.environ.items()
                                 if k != "TORCH_EXTENSIONS_DIR"}) == [
        Path(get_default_build_root())]
    assert extension_roots({"TORCH_EXTENSIONS_DIR": str(tmp_path)}) == [tmp_path]


def test_a_lock_older_than_the_trial_is_named_and_a_newer_one_is_not(tmp_path: Path) -> None:
    old = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    old.parent.mkdir(parents=True)
    old.touch()
    os.utime(old, (time.time() - 600, time.time() - 600))
    now = [0.0]
    watch = ProgressWatch(_NoSteps(), first_step_s=10, no_progress_s=10, expected_steps=5,
                          clock=lambda: now[0], lock_env={"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    now[0] = 11.0
    assert watch.stalled()
    assert str(old) in watch.describe() and "Delete it" in watch.describe()
    # a build that started during the trial is in progress, not stale
    fresh = tmp_path / "other_op" / "lock"
    fresh.parent.mkdir()
    fresh.touch()
    # stamped a tick before the start, as the kernel's coarse clock can (a CI failure)
    os.utime(fresh, (watch.started_wall - 0.004, watch.started_wall - 0.004))
    assert stale_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)},
                             before=watch.started_wall) == [old]
    silent = ProgressWatch(_NoSteps(), first_step_s=10, no_progress_s=10, expected_steps=5,
                           clock=lambda: now[0])
    assert "lock" not in silent.describe()


def test_a_trial_waiting_on_a_stale_lock_is_stopped_with_the_lock_named(tmp_path: Path) -> None:
    ext = tmp_path / "ext"
    (ext / "my_op").mkdir(parents=True)
    (ext / "my_op" / "lock").touch()  # what a program killed mid-build leaves
    os.utime(ext / "my_op" / "lock", (time.time() - 60, time.time() - 60))
    script = tmp_path / "waiter.py"
    script.write_text(_WAITER)
    config = WorkloadConfig(kind="command", argv=(sys.executable, str(script)),
                            no_progress_s=3, env={"TORCH_EXTENSIONS_DIR": str(ext)})
    launcher = LocalLauncher()
    launcher.workload = CommandWorkload(config, ClusterConfig(devices_per_node=1, device="cpu"))
    spec = TrialSpec(model=ModelConfig(n_layer=1, hidden=32, n_head=4, ffn_hidden=64,
                                       seq_len=16, vocab_size=64),
                     layout=Layout(tp=1, pp=1, dp=1, micro_batch=1, grad_accum=1),
                     run=RunConfig(device="cpu", warmup_steps=1, measure_steps=2,
                                   measure_precision=None))
    paths = TrialPaths(tmp_path / "trial")
    report = launcher.run(spec, paths, timeout_s=120)
    assert report.no_progress and str(ext / "my_op" / "lock") in report.no_progress_reason
    assert str(ext / "my_op" / "lock") in classify(report).reason
