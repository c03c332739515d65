"""No file of the tree holds a merge's conflict markers: a half-resolved merge once left
three pages of docs/ with both sides in them, which no other test reads as wrong."""

from __future__ import annotations

import re
import subprocess

from tests.helpers import REPO

_MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
_TEXT = (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".cfg", ".json", ".csv")


def leftovers(text: str) -> list[int]:
    """The line numbers of conflict markers in ``text``."""
    return [text.count("\n", 0, m.start()) + 1 for m in _MARKER.finditer(text)]


def test_a_conflict_marker_is_found() -> None:
    text = "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\n"
    assert leftovers(text) == [2, 4, 6]
    assert leftovers("a\n======= not a marker\n<<<<<<<<\n") == []


def test_no_tracked_file_holds_conflict_markers() -> None:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    files = (listed.stdout.split() if listed.returncode == 0 else
             [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
              and not any(part.startswith(".") for part in p.relative_to(REPO).parts)])
    bad = []
    for name in files:
        if not name.endswith(_TEXT):
            continue
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        bad += [f"{name}:{line}" for line in leftovers(text)]
    assert not bad, "conflict markers left by a merge:\n  " + "\n  ".join(bad)
