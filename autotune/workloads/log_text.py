"""Log text as a program printed it, made readable for the log adapters.

The argonne-lcf fork logs through ezpz's ``rich`` handler, which colours every number and
key with ANSI escape sequences even into a file (found on its real ``training_log`` lines:
``\\x1b[94miteration\\x1b[0m=       \\x1b[1;36m1\\x1b[0m/...``): the adapters read the text with
the escapes removed (ECMA-48 "Select Graphic Rendition" and the other CSI sequences).

>>> strip_ansi("\\x1b[94melapsed_time_per_iteration_ms\\x1b[0m="
...            "\\x1b[1;36m182\\x1b[0m\\x1b[1;36m.4\\x1b[0m")
'elapsed_time_per_iteration_ms=182.4'
"""

from __future__ import annotations

import re

__all__ = ["strip_ansi"]

_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(line: str) -> str:
    """``line`` without ANSI CSI escape sequences (colours, bold, cursor moves)."""
    return _CSI.sub("", line) if "\x1b" in line else line
