"""``python -m autotune.campaign``: the campaign commands without the main CLI."""

import sys

from autotune.campaign.cli import main

sys.exit(main())
