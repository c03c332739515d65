"""docs/study-files.md documents every study-file key as the config dataclasses define it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from autotune.cli import docgen
from autotune.config._allowed import Rules, rules_of
from autotune.config._fields import check_float, check_int
from autotune.config.cluster import MAX_NODES, ClusterConfig
from autotune.config.launcher import LauncherConfig
from autotune.config.model import ModelConfig
from autotune.config.study import (
    MAX_DEGREE,
    SearchConfig,
    StorageConfig,
    TrainingConfig,
    TrialConfig,
)
from autotune.spec import SECTIONS

CONFIGS = {"model": ModelConfig, "cluster": ClusterConfig, "training": TrainingConfig,
           "search": SearchConfig, "trial": TrialConfig, "storage": StorageConfig,
           "launcher": LauncherConfig}


def test_the_doc_is_the_generated_reference() -> None:
    text = docgen.DOC.read_text()
    assert text == docgen.render_file(text), (
        "docs/study-files.md is out of date: run python -m autotune.cli.docgen --write")


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
                default = f"`{docgen.yaml_text(f.default)}`"
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


def test_the_bounds_are_shown() -> None:
    keys = {k.path: k for k in docgen.study_keys()}
    assert keys["cluster.nodes"].allowed == f"an integer >= 1 and <= {MAX_NODES}"
    assert keys["model.hidden"].allowed == "an integer >= 1 and <= 1000000"  # a loop's item
    assert keys["cluster.peak_tflops"].allowed == "a number > 0 and <= 1000000, or `null`"
    assert keys["cluster.links.inter_node_gbps"].allowed.startswith("a number > 0 and <= ")
    assert keys["model.name"].allowed == "one line of printable text of at most 100 characters"
    assert keys["search.tp"].allowed.startswith("a list of at most 1000 integers >= 1 and <= ")
    assert "< 0.5" in keys["trial.memory_min_p_fit"].allowed
    assert keys["cluster.profile"].default == "`null`"
    assert keys["cluster.profile"].allowed.startswith("the path of a layer-profile JSON file")


def test_the_rules_of_a_sections_helpers_are_read() -> None:
    """A section's validators may sit in helpers of the config package (the ZeRO-3 variant
    and Ulysses axes in ``config._strategy_axes``): their rules are read, with the bounds
    their callers bind (``max_degree=MAX_DEGREE``), and two checks of one key show as one
    range. Before, these keys read "a list of integers"."""
    keys = {k.path: k for k in docgen.study_keys()}
    assert keys["search.zero_variant"].allowed.startswith("each item one of `none`, `mics`, "
                                                          "`hpz`")
    # parse_strategy_axes -> _ints (>= 1, <= MAX_DEGREE) and check_strategy_axes (>= 2)
    assert f"each item an integer >= 2 and <= {MAX_DEGREE}" in keys[
        "search.zero_shard_size"].allowed
    assert f"each item an integer >= 1 and <= {MAX_DEGREE}" in keys["search.ulysses"].allowed
    assert "include 1, or sequence_parallel false" in keys["search.ulysses"].allowed
    assert keys["search.min_improvement"].allowed.startswith("a fraction >= 0 and < 1")
    # fp16's launcher rule (check_fp16_replay, in parse_study) is the field's docstring's.
    assert keys["training.dtype"].allowed == "one of `bf16`, `fp32`, `fp16`"


def test_two_integer_checks_of_one_key_show_their_tighter_bounds() -> None:
    rules = Rules()
    rules.add_int("s.k", True, 1, 100)
    rules.add_int("s.k", True, 2, None)
    rules.add_int("s.k", False, 1, None)
    assert rules.allowed["s.k"] == ["each item an integer >= 2 and <= 100",
                                    "an integer >= 1"]


LIMITS = {"a": 10, "b": 20}


@dataclass(frozen=True)
class Bounded:
    """Validators whose bounds are module constants, loop variables and a local."""

    a: int = 1
    b: int = 2
    c: float = 1.0

    def __post_init__(self) -> None:
        for name, low in (("a", 0), ("b", 2)):
            check_int(f"y.{name}", getattr(self, name), minimum=low, maximum=LIMITS[name])
        check_float("y.c", self.c, maximum=self.a * LIMITS["b"])


def test_a_bound_that_cannot_be_evaluated_is_shown_as_its_source() -> None:
    assert rules_of(Bounded).allowed == {
        "y.a": ["an integer >= 0 and <= 10"], "y.b": ["an integer >= 2 and <= 20"],
        "y.c": ["a number >= 0 and <= `self.a * 20`"]}


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
