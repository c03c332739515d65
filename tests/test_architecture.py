"""Import direction: data flows one way (docs/architecture.md), so the imports do too.

Every import of every module is read with :mod:`ast` — top-level, inside functions (lazy
imports), under ``TYPE_CHECKING`` — and no module of a layer may import one it must not
know. A failure names each offending module, line and import.

The runner is ``autotune.runner``. Two of its modules are schemas rather than machinery:
``storage.records`` (every key a trial and a study store, with their readers) and
``runner.outcome`` (the outcome kinds and their Optuna states). Readers of a study (the
report, ``results``, campaigns) must use them to read what the runner wrote, as they use
``storage.schema`` for SQL; so the report may import those two and nothing else of the
runner, and those two import nothing of the loop or of a launcher (checked below), so
nothing reaches the loop through them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO

RUNNER = ("autotune.runner",)
"""The whole runner package."""
RUNNER_LOOP = ("autotune.runner.study", "autotune.runner.optuna_io", "autotune.runner.budget",
               "autotune.runner.lifecycle", "autotune.runner.progress")
"""The runner's machinery: everything of it but its two schema modules."""
RUNNER_SCHEMAS = ("autotune/storage/records.py", "autotune/runner/outcome.py")
"""The runner's schema modules. ``outcome`` names the launcher's ``LaunchReport`` as the type
it classifies (under ``TYPE_CHECKING``), so the launchers are forbidden to ``records`` only."""
LAUNCHERS = ("autotune.launchers",)
SEARCH = ("autotune.search",)
MODELS = ("autotune.models",)


@dataclass(frozen=True)
class Import:
    module: str
    """The importing module (``autotune.report.analysis``)."""
    line: int
    target: str
    """The module imported, absolute (``autotune.study``; ``from autotune import study``
    gives ``autotune.study`` too)."""

    def __str__(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parse_imports(source: str, module: str, *, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` (the text of ``module``), wherever it stands, with
    relative ones made absolute."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [Import(module, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[:len(parts) - node.level + 1], *([base] if base else [])])
            out.append(Import(module, node.lineno, base))
            # ``from pkg import mod`` imports ``pkg.mod`` when it is a module.
            out += [Import(module, node.lineno, f"{base}.{alias.name}") for alias in node.names
                    if alias.name != "*"]
    return out


def imports_of(path: Path) -> list[Import]:
    return parse_imports(path.read_text(), module_name(path),
                         is_package=path.name == "__init__.py")


def imports_under(folder: str) -> list[Import]:
    return [imp for path in sorted((REPO / folder).rglob("*.py"))
            for imp in imports_of(path)]


def offending(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    """``folder``'s (or one file's) imports of any of ``forbidden`` (a package and
    everything in it), one per import statement."""
    out: dict[tuple[str, int], str] = {}
    path = REPO / folder
    found = imports_of(path) if path.is_file() else imports_under(folder)
    for imp in found:
        if any(imp.target == f or imp.target.startswith(f + ".") for f in forbidden):
            out.setdefault((imp.module, imp.line), str(imp))
    return list(out.values())


RULES = [
    pytest.param("autotune/models", RUNNER + LAUNCHERS, id="models-know-no-runner-or-launcher"),
    pytest.param("autotune/report", RUNNER_LOOP + LAUNCHERS,
                 id="report-knows-no-runner-loop-or-launcher"),
    pytest.param(RUNNER_SCHEMAS[0], RUNNER_LOOP + LAUNCHERS + SEARCH, id="records-is-a-leaf"),
    pytest.param(RUNNER_SCHEMAS[1], RUNNER_LOOP + SEARCH, id="outcome-is-a-leaf"),
    pytest.param("autotune/config", MODELS, id="config-knows-no-models"),
    pytest.param("trainer", RUNNER + SEARCH, id="trainer-knows-no-runner-or-search"),
]


@pytest.mark.parametrize(("folder", "forbidden"), RULES)
def test_import_direction(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = offending(folder, forbidden)
    assert not bad, (f"{folder}/ must not import {', '.join(forbidden)}:\n  "
                     + "\n  ".join(bad))


def test_the_reader_sees_lazy_relative_and_from_imports() -> None:
    source = ("from . import sibling\nfrom ..models import cost\nimport autotune.layout\n"
              "def f():\n    from autotune import study\n"
              "if TYPE_CHECKING:\n    from autotune.launchers.base import Launcher\n")
    found = {i.target for i in parse_imports(source, "autotune.report.m")}
    assert {"autotune.report.sibling", "autotune.models.cost", "autotune.layout",
            "autotune.study", "autotune.launchers.base"} <= found
    assert "autotune.config._fields" in {
        i.target for i in parse_imports("from ._fields import x\n", "autotune.config",
                                        is_package=True)}
    # On the real tree: the feasibility check's memory-model import sits inside a function.
    assert any(imp.target == "autotune.models.memory" and imp.module == "autotune.feasibility"
               for imp in imports_of(REPO / "autotune/feasibility.py"))


def test_a_forbidden_import_is_caught() -> None:
    """The rule can fail: a report module importing the loop is named with its line."""
    found = parse_imports("import os\nfrom autotune.runner.study import run_study\n",
                          "autotune.report.x")
    bad = {(i.module, i.line) for i in found if any(i.target.startswith(f) for f in RUNNER_LOOP)}
    assert bad == {("autotune.report.x", 2)}
