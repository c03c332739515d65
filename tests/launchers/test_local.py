"""The local (torchrun) launcher against the launcher contract, with the real trainer."""

from __future__ import annotations

import pytest

from autotune.launchers.local import LocalLauncher
from tests.launchers.contract import LauncherContract

pytestmark = pytest.mark.slow


class TestLocalLauncher(LauncherContract):
    @pytest.fixture
    def launcher(self) -> LocalLauncher:
        return LocalLauncher()
