"""Import direction: data flows one way (docs/architecture.md), so the imports do too.

Every import of every module is read with :mod:`ast` — top-level, inside functions (lazy
imports), under ``TYPE_CHECKING`` — and no module of a layer may import one it must not
know. A failure names each offending module, line and import.

The runner is ``autotune.runner`` (the study loop, its lifecycle, outcome mapping, trial
records and progress); until that package exists its modules are the flat
``autotune.study``, ``lifecycle``, ``outcome``, ``records`` and ``progress``, so both names
are forbidden.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO

RUNNER = ("autotune.runner", "autotune.study", "autotune.lifecycle", "autotune.outcome",
          "autotune.records", "autotune.progress")
"""The runner package and the flat modules it is made of today."""
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
    """``folder``'s imports of any of ``forbidden`` (a package and everything in it), one
    per import statement."""
    out: dict[tuple[str, int], str] = {}
    for imp in imports_under(folder):
        if any(imp.target == f or imp.target.startswith(f + ".") for f in forbidden):
            out.setdefault((imp.module, imp.line), str(imp))
    return list(out.values())


RULES = [
    pytest.param("autotune/models", RUNNER + LAUNCHERS, id="models-know-no-runner-or-launcher"),
    pytest.param("autotune/report", RUNNER + LAUNCHERS, id="report-knows-no-runner-or-launcher",
                 marks=pytest.mark.xfail(strict=True, reason="until the branch that defines the "
                                         "search axes on Layout lands (report/analysis.py "
                                         "imports autotune.study.AXES)")),
    pytest.param("autotune/config", MODELS, id="config-knows-no-models",
                 marks=pytest.mark.xfail(strict=True,
                                         reason="until the devtable branch lands")),
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
    # On the real tree: cluster.py's profile import sits inside a function.
    assert any(imp.target == "autotune.models.profile" and imp.module == "autotune.config.cluster"
               for imp in imports_under("autotune/config"))
