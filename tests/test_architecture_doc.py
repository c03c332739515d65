"""docs/architecture.md names modules and functions that exist: every path with a folder
(``runner/study.py``, ``autotune/storage/store.py``) is a file of the tree, and every
dotted name in backticks (``trial/classify.classify``, ``runner.optuna_io.open_study``)
resolves to a module and, where it names one, an attribute of it. The other docs and the
README the same way for the code they name: a Python file of this tree (its path starts
with a folder of the repository or a package of ``autotune``; a path of another project,
``megatron/model/gpt_model.py``, does not), with the name after it
(``autotune/scaling/sizes.py::scaling_efficiency``), and every ``autotune.``/``trainer.``
dotted name; and every study-file key they name (``search.confirm_budget``) is one the
generated reference, docs/study-files.md, lists."""

from __future__ import annotations

import importlib
import re

from tests.helpers import REPO, deepest_object

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
    walked = deepest_object(".".join(parts))
    if walked is None:
        return f"{name}: no such module"
    return f"{name}: no {'.'.join(walked[1])} there" if walked[1] else None


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


_OWN_PY = re.compile(r"`((?:[A-Za-z_0-9.-]+/)+[A-Za-z_0-9]+\.py)(?:(?:::|\.)([A-Za-z_][\w.]*))?`")
_QUALIFIED = re.compile(r"`((?:autotune|trainer)(?:\.[A-Za-z_]\w*)+)`")
_TOPS = {p.name for p in REPO.iterdir() if p.is_dir()} | PACKAGES
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]


def code_named(text: str) -> list[str]:
    """Why each piece of this tree's code that ``text`` names does not exist."""
    bad = []
    for m in _OWN_PY.finditer(text):
        path, name = m.groups()
        if path.split("/")[0] not in _TOPS:
            continue  # another project's file
        if not _file(path):
            bad.append(f"{path}: no such file")
        elif name:  # in the package, or a script's (benchmarks/, tests/) as importable
            top = next(t for t in ("", "autotune/", "trainer/") if (REPO / t / path).is_file())
            module = f"{top}{path[:-3]}"
            if module.split("/")[0] in ("autotune", "trainer"):
                bad.append(unresolved(f"{module}.{name}") or "")
            elif not hasattr(importlib.import_module(module.replace("/", ".")), name.split(".")[0]):
                bad.append(f"{path}: no {name}")
    bad += [unresolved(m.group(1)) or "" for m in _QUALIFIED.finditer(text)]
    return [b for b in bad if b]


def test_every_doc_names_code_that_exists() -> None:
    bad = {doc.name: why for doc in DOCS if (why := code_named(doc.read_text()))}
    assert not bad, bad


def test_a_false_claim_is_caught() -> None:
    assert code_named("`autotune/models/calibration.py::gaussian_log_evidence`")
    assert not code_named("`autotune/models/evidence.py::gaussian_log_evidence`")
    assert code_named("`autotune.models.calibration.evidence_scale`")
    assert code_named("`runner/nonexistent.py`")
    assert code_named("`benchmarks/plan_cpu_time.py::no_such_function`")
    assert not code_named("`megatron/model/gpt_model.py`, `scaling/sizes.py::scaling_efficiency`")
    assert unresolved("runner.outcome.classify") is not None
    assert unresolved("trial/classify.classify") is None
    assert unresolved("storage.store.TrialStore.claim") is None
    assert not _file("runner/nonexistent.py")


_SECTIONS = ("model", "cluster", "training", "search", "trial", "storage", "launcher",
             "workload")
_KEY = re.compile(r"`((?:" + "|".join(_SECTIONS) + r")\.[a-z_]+(?:\.[a-z_]+)*)(?::[^`]*)?`")
NOT_KEYS = {
    "training.grad_accum_dtype": "filled in by the loader from the workload, not written",
    "search.gpu_freq": "named in docs/search.md as not done",
}


def reference_keys() -> set[str]:
    """Every section and key of the generated docs/study-files.md."""
    keys, section = set(), None
    for line in (REPO / "docs" / "study-files.md").read_text().splitlines():
        if heading := re.match(r"#{2,4} `([\w.]+)`", line):
            section = heading.group(1)
            keys.add(section)
        elif (key := re.match(r"- \*\*`(\w+)`\*\*", line)) and section:
            keys.add(f"{section}.{key.group(1)}")
    return keys


def unknown_keys(text: str, keys: set[str]) -> set[str]:
    """The study-file keys ``text`` names in backticks that the reference does not have (a
    module's file, ``model.py``, or dotted name, ``storage.claims.claim_first``, is code)."""
    return {k for m in _KEY.finditer(text) if (k := m.group(1)) not in keys
            and k not in NOT_KEYS and not k.endswith(".py")
            and not (k.count(".") >= 2 and unresolved(k) is None)}


def test_every_study_file_key_the_docs_name_exists() -> None:
    keys = reference_keys()
    assert {"search.confirm_budget", "launcher.replay.study_check", "model.dropout"} <= keys
    bad = {doc.name: found for doc in DOCS if doc.name != "study-files.md"
           if (found := unknown_keys(doc.read_text(), keys))}
    assert not bad, bad
    assert unknown_keys("`search.plan_order` and `trial.batch_size: 4`", keys) == {
        "search.plan_order"}
