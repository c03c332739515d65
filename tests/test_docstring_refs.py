"""Every Sphinx cross-reference in a docstring or comment of ``autotune/`` and ``trainer/``
names an object that exists: ``:func:``, ``:class:``, ``:data:``, ``:mod:`` and ``:exc:``
roles, and ``:meth:`` and ``:attr:`` roles that name their class, fully qualified or
relative to their module or its package (a bare method or attribute is its class's, left
to the reader). A function moved to another module leaves its old name behind in prose;
this finds it."""

from __future__ import annotations

import builtins
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import REPO, deepest_object

ROLE = re.compile(r":(func|class|data|mod|exc):`~?([A-Za-z_][\w.]*)`"
                  r"|:(meth|attr):`~?([A-Za-z_]\w*\.[\w.]+)`")
OURS = ("autotune", "trainer")


def _instance_attribute(cls: object, name: str) -> bool:
    if not isinstance(cls, type):
        return False
    if name in getattr(cls, "__dataclass_fields__", {}):
        return True
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return re.search(rf"self\.{name}\b\s*(:[^=]*)?=", source) is not None


def _lookup(dotted: str) -> bool:
    """The name resolves, its last part possibly an attribute its class sets in ``__init__``
    or a dataclass field without a default."""
    walked = deepest_object(dotted)
    if walked is None:
        return False
    found, rest = walked
    return not rest or (len(rest) == 1 and _instance_attribute(found, rest[0]))


def _resolves(name: str, module: ModuleType) -> bool:
    """``name`` as a role in ``module``'s text: fully qualified if it starts with one of our
    packages, else relative to the module (its own or imported names) or its package."""
    head = name.split(".")[0]
    if head in OURS:
        return _lookup(name)
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    if _lookup(f"{module.__name__}.{name}") or _lookup(f"{package}.{name}"):
        return True
    if hasattr(module, head):  # the module's own name: the look-ups above did not find it
        return False
    if hasattr(builtins, head):
        return True
    try:  # another library's name (torch.distributed, optuna.Study, ...): not ours to check
        importlib.import_module(head)
        return True
    except ImportError:
        return False


def _modules() -> list[Path]:
    return sorted(p for top in OURS for p in (REPO / top).rglob("*.py")
                  if "__pycache__" not in p.parts and p.name != "__main__.py")


@pytest.mark.parametrize("top", OURS)
def test_every_cross_reference_names_an_object_that_exists(top: str) -> None:
    unresolved = []
    for path in _modules():
        rel = path.relative_to(REPO)
        if rel.parts[0] != top:
            continue
        name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(name)
        text = path.read_text()
        for m in ROLE.finditer(text):
            role, target = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            if not _resolves(target, module):
                line = text.count("\n", 0, m.start()) + 1
                unresolved.append(f"{rel}:{line}: :{role}:`{target}`")
    assert not unresolved, "\n".join(unresolved)


def test_a_moved_function_is_found() -> None:
    links = importlib.import_module("autotune.models.links")
    profile = importlib.import_module("autotune.models.profile")
    assert _resolves("autotune.models.links.link_level", profile)
    assert not _resolves("autotune.models.cost.link_level", profile)  # where it once was
    assert _resolves("link_level", links) and not _resolves("link_levels", links)
    assert _resolves("ClusterConfig.links", links)  # an imported class's dataclass field
    assert not _resolves("ClusterConfig.no_such_field", links)
    assert _resolves("autotune.search.Strategy.stop", links)  # set in __init__
    assert not _resolves("autotune.search.Strategy.stopped", links)
    assert _resolves("ValueError", links) and _resolves("torch.distributed.all_reduce", links)
