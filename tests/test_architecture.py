"""Import direction: data flows one way (docs/architecture.md, "The import rule"), so the
imports do too.

Every import of every module is read with :mod:`ast` — top-level, inside functions (lazy
imports), under ``TYPE_CHECKING`` — and no module of a layer may import one it must not
know. A failure names each offending module, line and import.

The layers, bottom up: ``config`` (with ``layout``, ``hardware``, ``errors``), ``models``,
``trial`` (what a trial is: spec, result, paths, report, outcome), ``storage`` (the
database, the stored keys and the ``measurements`` row), ``workloads`` and ``launchers``
(what runs, where), ``search``, ``runner``, and the readers on top: ``report`` (it reads
storage, never the runner). No module imports one that imports it back (no circle).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO

RUNNER = ("autotune.runner",)
LAUNCHERS = ("autotune.launchers",)
WORKLOADS = ("autotune.workloads",)
SEARCH = ("autotune.search",)
MODELS = ("autotune.models",)
TRIAL = ("autotune.trial",)
REPORT = ("autotune.report",)


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
    pytest.param("autotune/config", MODELS + TRIAL + WORKLOADS + LAUNCHERS + SEARCH + RUNNER,
                 id="config-knows-nothing-above-it"),
    pytest.param("autotune/feasibility/__init__.py", SEARCH + RUNNER + LAUNCHERS,
                 id="feasibility-knows-no-search"),
    pytest.param("autotune/models", RUNNER + LAUNCHERS + WORKLOADS + SEARCH,
                 id="models-know-no-runner-launcher-workload-or-search"),
    pytest.param("autotune/trial", RUNNER + LAUNCHERS + WORKLOADS + SEARCH + REPORT,
                 id="trial-knows-no-runner-launcher-or-workload"),
    pytest.param("autotune/storage", RUNNER + LAUNCHERS + WORKLOADS + SEARCH + REPORT,
                 id="storage-knows-no-runner-launcher-or-workload"),
    pytest.param("autotune/workloads", RUNNER + LAUNCHERS + SEARCH,
                 id="workloads-know-no-launcher-or-runner"),
    pytest.param("autotune/launchers", RUNNER + SEARCH, id="launchers-know-no-runner"),
    pytest.param("autotune/report", RUNNER + LAUNCHERS, id="report-knows-no-runner"),
    pytest.param("trainer", RUNNER + SEARCH + LAUNCHERS + ("autotune.storage",),
                 id="trainer-knows-no-runner-search-launcher-or-storage"),
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
    assert any(imp.target == "autotune.models.memory"
               and imp.module == "autotune.feasibility.memory_terms"
               for imp in imports_of(REPO / "autotune/feasibility/memory_terms.py"))


def test_a_forbidden_import_is_caught() -> None:
    """The rule can fail: a report module importing the loop is named with its line."""
    found = parse_imports("import os\nfrom autotune.runner.study import run_study\n",
                          "autotune.report.x")
    bad = {(i.module, i.line) for i in found if any(i.target.startswith(f) for f in RUNNER)}
    assert bad == {("autotune.report.x", 2)}


def module_graph() -> dict[str, set[str]]:
    """Every module of ``autotune/`` and ``trainer/`` -> the modules of the tree it imports.
    ``from pkg import submodule`` imports the submodule, not the package's own code."""
    paths = {module_name(p): p for top in ("autotune", "trainer")
             for p in sorted((REPO / top).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found = imports_of(path)
        submodule_lines = {(i.line, i.target.rpartition(".")[0]) for i in found
                           if i.target in paths}
        graph[name] = {i.target for i in found if i.target in paths and i.target != name
                       and not (i.target + ".__init__" not in paths
                                and (i.line, i.target) in submodule_lines)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (strongly connected components of two or more
    modules, Tarjan 1972), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    graph = module_graph()
    found = circles(graph)
    assert not found, "modules that import each other (directly or round a loop):\n  " + \
        "\n  ".join(" <-> ".join(c) + ": " + "; ".join(
            f"{a} -> {', '.join(sorted(graph[a] & set(c)))}" for a in c) for c in found)


def test_a_circle_is_caught() -> None:
    """The circle check can fail: a loop of three and a pair are found, a chain is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_from_a_package_import_a_submodule_is_no_import_of_the_package() -> None:
    """``from autotune.workloads import megatron`` in workloads/foreign.py imports
    workloads/megatron.py, not workloads/__init__.py (which imports foreign lazily)."""
    graph = module_graph()
    assert "autotune.workloads.megatron" in graph["autotune.workloads.foreign"]
    assert "autotune.workloads" not in graph["autotune.workloads.foreign"]


STORAGE_PUBLIC = ("autotune.storage", "autotune.storage.urls")
"""What may be imported of storage from outside it: the door (``autotune/storage/
__init__.py``: :class:`~autotune.storage.TrialStore` and the names the readers need) and
the URL helpers the launchers and the campaign use. Every other storage module is the
door's own."""


def storage_imports(folders: tuple[str, ...]) -> list[Import]:
    """The imports of storage modules by the modules of ``folders`` outside storage."""
    return [imp for folder in folders for imp in (
        imports_of(REPO / folder) if (REPO / folder).is_file() else imports_under(folder))
        if not imp.module.startswith("autotune.storage")
        and (imp.target == "autotune.storage" or imp.target.startswith("autotune.storage."))]


def _is_module(target: str) -> bool:
    """A module or package of the tree (``from autotune.storage import Name`` also reads
    as ``autotune.storage.Name``, which is none)."""
    path = REPO / target.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_nothing_outside_storage_imports_a_private_storage_module() -> None:
    """The service, the trainer and the benchmarks: a benchmark is a script, but it reads
    the database as any reader does (its imports read as ``benchmarks.NAME``'s)."""
    bad = [str(i) for i in storage_imports(("autotune", "trainer", "benchmarks"))
           if _is_module(i.target) and i.target not in STORAGE_PUBLIC]
    assert not bad, "import the door (autotune.storage) instead:\n  " + "\n  ".join(bad)


MAX_MODULE_LINES = 400
"""The most lines a module of ``autotune/``, ``trainer/`` or ``benchmarks/`` may hold: a
module owns one concern and reads top to bottom; one past this holds several, and is split
along their seams."""


def test_no_module_is_over_the_size_limit() -> None:
    long = [f"{path.relative_to(REPO)}: {n} lines"
            for top in ("autotune", "trainer", "benchmarks")
            for path in sorted((REPO / top).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"over {MAX_MODULE_LINES} lines:\n  " + "\n  ".join(long)


def test_the_runner_imports_at_most_two_storage_modules() -> None:
    modules = {i.target for i in storage_imports(("autotune/runner",)) if _is_module(i.target)}
    assert len(modules) <= 2, sorted(modules)


def test_a_private_storage_import_is_caught() -> None:
    found = parse_imports("from autotune.storage.claims import claim_first\n"
                          "from autotune.storage import TrialStore\n", "autotune.report.x")
    private = {i.line for i in found if i.target == "autotune.storage.claims"}
    assert private == {1}


LAYERS: dict[str, int] = {
    # values
    "autotune.errors": 0, "autotune.layout": 0, "autotune.hardware": 0, "autotune.util": 0,
    "autotune.objective": 0, "autotune.metrics_writer": 0,
    # configs
    "autotune.config": 1,
    # models (and the space's enumeration, which the study-file loader checks)
    "autotune.models": 2, "autotune.feasibility": 2, "autotune.landscape": 2,
    "autotune.dsconfig": 2, "autotune.energy": 2, "autotune.planning.space": 2,
    # a trial; the trainer sits beside it and knows nothing above
    "autotune.trial": 3, "trainer": 3,
    "autotune.storage": 4,
    "autotune.workloads": 5,
    # the study file, the sites, the launchers
    "autotune.spec": 6, "autotune.sites": 6, "autotune.launchers": 6,
    # readers
    "autotune.report": 7,
    # planning and search
    "autotune.planning": 8, "autotune.search": 8,
    # the loops
    "autotune.runner": 9, "autotune.scaling": 9, "autotune.campaign": 9,
    "autotune.profiling": 9,
    # entry points and tools
    "autotune.cli": 10, "autotune.__main__": 10, "autotune": 10,
}
"""The import rule as data (docs/architecture.md, "The import rule"): every package and
top-level module of ``autotune/`` and ``trainer/`` -> its layer; a module may import its
own layer and those below. The longest matching name decides (``autotune.planning.space``
sits below ``autotune.planning``)."""


def layer_of(module: str) -> tuple[str, int] | None:
    found = [(k, v) for k, v in LAYERS.items() if module == k or module.startswith(k + ".")]
    return max(found, key=lambda kv: len(kv[0])) if found else None


def upward(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine and theirs and theirs[1] > mine[1]:
                out.append(f"{module} (layer {mine[1]}, {mine[0]}) imports {target} "
                           f"(layer {theirs[1]}, {theirs[0]})")
    return out


def test_every_package_and_module_has_a_layer() -> None:
    missing = sorted(m for m in module_graph() if layer_of(m) is None)
    assert not missing, missing
    packages = {f"autotune.{p.name}" for p in (REPO / "autotune").iterdir()
                if (p / "__init__.py").is_file()}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def test_no_module_imports_from_a_higher_layer() -> None:
    bad = upward(module_graph())
    assert not bad, "imports from a higher layer:\n  " + "\n  ".join(bad)


def test_an_upward_import_is_caught() -> None:
    graph = {"autotune.storage.x": {"autotune.runner.worker"}, "autotune.runner.y": {
        "autotune.storage.x"}}
    assert upward(graph) == ["autotune.storage.x (layer 4, autotune.storage) imports "
                             "autotune.runner.worker (layer 9, autotune.runner)"]


def test_every_import_of_the_tree_names_a_module_that_exists() -> None:
    """A module moved or renamed leaves no import of its old path behind, also inside a
    function (mypy, with ``ignore_missing_imports``, does not say so; a lazy import fails
    only when its code runs)."""
    modules = {module_name(p) for top in ("autotune", "trainer")
               for p in (REPO / top).rglob("*.py")}
    missing = []
    for top in ("autotune", "trainer", "tests", "benchmarks"):
        for path in sorted((REPO / top).rglob("*.py")):
            module = module_name(path)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")
                        base = ".".join([*parts[:len(parts) - node.level + 1],
                                         *([base] if base else [])])
                    names = [base]
                else:
                    continue
                missing += [f"{module} (line {node.lineno}) imports {name}" for name in names
                            if name.split(".")[0] in ("autotune", "trainer")
                            and name not in modules]
    assert not missing, "\n".join(missing)
