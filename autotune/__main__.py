"""``python -m autotune`` is the ``autotune`` command."""

from __future__ import annotations

import sys

from autotune.cli import main

sys.exit(main())
