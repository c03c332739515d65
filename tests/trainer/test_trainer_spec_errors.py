"""A bad spec ends with exit code 2 and a result naming the field, before torch loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_launch import launch, spec


def _run_bad(tmp_path: Path, sp: dict) -> tuple[int, dict]:
    code, out = launch(tmp_path, 1, {"bad": sp}, torchrun=False, timeout_s=60)
    return code, out["bad"]


def test_missing_field(tmp_path: Path) -> None:
    sp = spec()
    del sp["layout"]["micro_batch"]
    code, r = _run_bad(tmp_path, sp)
    assert code == 2 and r["status"] == "error"
    assert "layout.micro_batch" in r["error"]


def test_all_layout_reasons_are_reported(tmp_path: Path) -> None:
    sp = spec(tp=3, pp=2)  # tp does not divide 4 heads, and world size 1 != 6
    code, r = _run_bad(tmp_path, sp)
    assert code == 2
    assert "[world_size]" in r["error"] and "[tp_heads]" in r["error"]
    assert "[tp_hidden]" in r["error"]


@pytest.mark.parametrize("section, key, value, field", [
    ("run", "dtype", "fp8", "run.dtype"),
    ("model", "n_head", 5, "model.n_head"),
    ("layout", "zero_stage", 7, "layout.zero_stage"),
    ("model", "attention", "sparse", "model.attention"),
    ("model", "dropout", 1.0, "model.dropout"),  # a probability below 1
])
def test_invalid_values_name_the_field(tmp_path: Path, section: str, key: str, value: object,
                                       field: str) -> None:
    sp = spec()
    sp[section][key] = value
    code, r = _run_bad(tmp_path, sp)
    assert code == 2 and field in r["error"]


@pytest.mark.parametrize("content, error", [
    ("{not json", "not valid JSON"),
    # Before, each of these three was a traceback and no result at all.
    (b"\x7fELF\x02\x01\xd0\xff", "not valid JSON ('utf-8' codec can't decode"),
    ("[" * 100_000, "not valid JSON (nested too deeply)"),
    (None, "cannot read it (Is a directory)"),  # --spec names a folder
])
def test_unreadable_spec(tmp_path: Path, content: str | bytes | None, error: str) -> None:
    path = tmp_path / "x.json"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    from trainer.__main__ import main

    assert main(["--spec", str(path), "--result", str(tmp_path / "x.out.json")]) == 2
    assert error in json.loads((tmp_path / "x.out.json").read_text())["error"]
