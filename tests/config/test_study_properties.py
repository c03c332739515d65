"""Random invalid study files never crash: ``parse_study`` raises SpecError naming a field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.errors import SpecError
from autotune.spec import SECTIONS, load_study, parse_study

REPO = Path(__file__).resolve().parents[2]
VALID = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "studies").glob("*.yaml"))]

BAD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**6, max_value=0),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    return out


def _set(doc: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _delete(doc: dict, path: tuple) -> None:
    for key in path[:-1]:
        doc = doc[key]
    del doc[path[-1]]


@st.composite
def mutated(draw) -> tuple[dict, str]:
    doc = copy.deepcopy(draw(st.sampled_from(VALID)))
    paths = _paths(doc)
    kind = draw(st.sampled_from(["value", "unknown_key", "delete", "negative", "not_mapping"]))
    path = draw(st.sampled_from(paths))
    if kind == "value":
        _set(doc, path, draw(BAD_VALUES))
    elif kind == "negative":
        _set(doc, path, -draw(st.integers(min_value=1, max_value=1000)))
    elif kind == "unknown_key":
        section = draw(st.sampled_from([p for p in paths if len(p) == 1
                                        and isinstance(doc[p[0]], dict)]))
        _set(doc, (*section, "no_such_key_" + draw(st.text("abc", min_size=1, max_size=3))), 1)
    elif kind == "delete":
        _delete(doc, path)
    else:
        doc = draw(st.sampled_from([[doc], "text", 3, None]))
    return doc, kind


@settings(max_examples=300, deadline=None)
@given(mutated())
def test_mutated_study_files_raise_spec_error_or_parse(case) -> None:
    doc, kind = case
    try:
        spec = parse_study(doc)
    except SpecError as err:
        assert err.field and isinstance(err.field, str)
        assert err.field.split(".")[0].split("[")[0] in (*SECTIONS, "study", "STUDY")
        return
    # Some mutations are still valid (deleting an optional key, a value that happens to
    # be allowed); then the result must be a proper spec.
    assert kind in ("value", "delete", "negative") and spec.world_size >= 1


@pytest.mark.parametrize(("doc", "field"), [
    ({"model": {"preset": "tiny"}, "cluster": {}, "training": {"global_batch": -1}},
     "training.global_batch"),
    ({"model": {"preset": "tiny"}, "cluster": {"nodes": "two"}, "training": {"global_batch": 8}},
     "cluster.nodes"),
    ({"model": {"preset": "tiny"}, "training": {"global_batch": 8}}, "cluster"),
    ({"model": {"preset": "tiny"}, "cluster": {}, "training": {"global_batch": 8},
      "search": {"tpp": [1]}}, "search.tpp"),
])
def test_error_names_the_field(doc: dict, field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_study(doc)
    assert info.value.field == field


@pytest.mark.parametrize("section", ["search", "trial", "storage", "launcher", "workload"])
@pytest.mark.parametrize("value", [0, False, "", []])
def test_a_falsy_optional_section_is_an_error_not_its_defaults(section: str,
                                                               value: object) -> None:
    # Before, `search: 0` or `launcher: false` was read as the section left empty: a
    # replay study with `launcher: 0` ran the built-in trainer locally.
    doc = {"model": {"preset": "tiny"}, "cluster": {}, "training": {"global_batch": 8},
           section: value}
    with pytest.raises(SpecError) as info:
        parse_study(doc)
    assert info.value.field == section and "expected a mapping" in str(info.value)
    doc[section] = None  # `search:` with nothing under it: the defaults
    assert parse_study(doc).name == "study"


def test_stop_on_repeated_error_allows_0_false_or_2_up_and_says_so() -> None:
    from autotune.config.study import SearchConfig

    assert SearchConfig.from_dict({"stop_on_repeated_error": False}).stop_on_repeated_error == 0
    assert SearchConfig.from_dict({"stop_on_repeated_error": 0}).stop_on_repeated_error == 0
    for bad in (1, -1, "2", 2.0, True):
        with pytest.raises(SpecError) as info:
            SearchConfig.from_dict({"stop_on_repeated_error": bad})
        # Before, the message (and the reference) said ">= 2" only, though 0 was allowed.
        assert "allowed: 0 or false (never stop), or an integer 2..1000000" in str(info.value)


def test_load_study_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_study(bad)
    with pytest.raises(SpecError, match="no such file"):
        load_study(tmp_path / "missing.yaml")
