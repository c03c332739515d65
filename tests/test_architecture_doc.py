"""docs/architecture.md names modules and functions that exist: every path with a folder
(``runner/study.py``, ``autotune/storage/store.py``) is a file of the tree, and every
dotted name in backticks (``trial/classify.classify``, ``runner.optuna_io.open_study``)
resolves to a module and, where it names one, an attribute of it."""

from __future__ import annotations

import importlib
import re

from tests.helpers import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGES = {p.name for p in (REPO / "autotune").iterdir() if (p / "__init__.py").is_file()}

_PATH = re.compile(r"`((?:[a-z_0-9]+/)+[a-z_0-9]+\.py)(?:[.:][A-Za-z_]\w*)?`")
_DOTTED = re.compile(r"`((?:autotune\.)?(?:[a-z_0-9]+/)*[a-z_0-9]+(?:\.[A-Za-z_]\w*)+)`")


def _file(path: str) -> bool:
    return any((REPO / top / path).is_file() for top in ("", "autotune", "trainer"))


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in _PATH.finditer(text)}


def unresolved(name: str) -> str | None:
    """Why a dotted name (``runner.outcome.classify``, ``trial/classify.classify``) does
    not resolve, ``None`` when it does."""
    if name.endswith(".py"):
        return None if _file(name) else f"{name}: no such file"
    parts = name.replace("/", ".").split(".")
    if parts[0] not in ("autotune", "trainer"):
        parts = ["autotune", *parts]
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        try:
            found: object = importlib.import_module(module)
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(found, attr):
                return f"{name}: {module} has no {'.'.join(parts[cut:])}"
            found = getattr(found, attr)
        return None
    return f"{name}: no such module"


def test_every_path_architecture_md_names_exists() -> None:
    missing = sorted(p for p in named_paths(DOC.read_text()) if not _file(p))
    assert not missing, missing


def test_every_dotted_name_architecture_md_names_resolves() -> None:
    text = DOC.read_text()
    # A module's path with a name (``trial/classify.classify``), a full dotted name, or
    # package.module.name (``runner.optuna_io.open_study``); a two-part ``trial.batch_size``
    # is a study-file key, not code.
    names = {m.group(1) for m in _DOTTED.finditer(text)
             if "/" in m.group(1) or m.group(1).startswith("autotune.")
             or (m.group(1).split(".")[0] in PACKAGES and m.group(1).count(".") >= 2)}
    bad = [why for name in sorted(names) if (why := unresolved(name)) is not None]
    assert not bad, bad


def test_a_false_claim_is_caught() -> None:
    assert unresolved("runner.outcome.classify") is not None
    assert unresolved("trial/classify.classify") is None
    assert unresolved("storage.store.TrialStore.claim") is None
    assert not _file("runner/nonexistent.py")
