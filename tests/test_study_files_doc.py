"""docs/study-files.md documents every study-file key as the config dataclasses define it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from autotune.config import docgen
from autotune.config.cluster import ClusterConfig
from autotune.config.launcher import LauncherConfig
from autotune.config.model import ModelConfig
from autotune.config.study import SearchConfig, StorageConfig, TrainingConfig, TrialConfig
from autotune.spec import SECTIONS

CONFIGS = {"model": ModelConfig, "cluster": ClusterConfig, "training": TrainingConfig,
           "search": SearchConfig, "trial": TrialConfig, "storage": StorageConfig,
           "launcher": LauncherConfig}


def test_the_doc_is_the_generated_reference() -> None:
    text = docgen.DOC.read_text()
    assert text == docgen.render_file(text), (
        "docs/study-files.md is out of date: run python -m autotune.config.docgen --write")


def test_every_section_and_field_is_documented_with_its_default() -> None:
    text = docgen.DOC.read_text()
    keys = {k.path: k for k in docgen.study_keys()}
    assert set(SECTIONS) <= set(keys)
    for section, cls in CONFIGS.items():
        for f in dataclasses.fields(cls):
            path = f"{section}.{f.name}"
            if path in docgen.NOT_IN_FILE:
                continue
            assert path in keys, f"{path} is not documented"
            if f.default is not dataclasses.MISSING and not dataclasses.is_dataclass(f.default):
                default = f"`{docgen._yaml(f.default)}`"
                assert keys[path].default in (default, "required") or keys[path].default \
                    .startswith(f"{default} (required "), path
            assert f"**`{f.name}`**" in text or f"`{path}`" in text, path


def test_what_is_allowed_comes_from_the_validators() -> None:
    keys = {k.path: k for k in docgen.study_keys()}
    assert keys["search.strategy"].allowed.startswith("one of `default`")
    assert keys["trial.memory_margin"].allowed == "a number >= 0 and <= 0.9"
    assert keys["search.zero_stage"].allowed.startswith("each item one of `0`, `1`, `2`, `3`")
    assert "a divisor of hidden" in keys["model.n_head"].allowed
    assert "a100-80gb" in keys["cluster.device"].allowed
    assert keys["launcher.replay"].default == "`null` (required when launcher.kind is `replay`)"
    assert keys["training.global_batch"].default == "required"


@dataclass(frozen=True)
class Probe:
    """A section whose loader accepts the keys of :data:`PROBE_KEYS`."""

    documented: int = 1
    """Says what it is."""
    added: int = 2
    internal: int = 3
    """Filled by the loader."""

    @classmethod
    def from_dict(cls, data: object) -> None:
        from autotune.config._fields import check_keys

        check_keys("x", data, PROBE_KEYS)


PROBE_KEYS: list[str] = []


@pytest.mark.parametrize(("keys", "error"), [
    (["documented", "added", "internal"], r"x\.added: the field has no docstring"),
    (["documented", "added"], r"\['internal'\] are no key of the file"),
])
def test_an_undocumented_or_undeclared_field_is_refused(
        monkeypatch: pytest.MonkeyPatch, keys: list[str], error: str) -> None:
    monkeypatch.setattr(f"{__name__}.PROBE_KEYS", keys)
    with pytest.raises(AssertionError, match=error):
        docgen._section_keys(Probe, "x")


def test_check_mode_reports_a_stale_file(tmp_path) -> None:
    stale = tmp_path / "study-files.md"
    stale.write_text(f"# x\n\n{docgen.BEGIN}\nold\n{docgen.END}\n")
    said: list[str] = []
    assert docgen.main(["--check"], doc=stale, out=said.append) == 1
    assert "out of date" in said[0]
    assert docgen.main(["--write"], doc=stale) == 0
    assert docgen.main(["--check"], doc=stale, out=said.append) == 0
