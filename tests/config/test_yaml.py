"""Smaller items of issue 23: YAML 1.1 numbers that YAML 1.2 reads otherwise (``1:0`` was
read as 60, ``0x10`` as 16) are refused with their key path, and a study file that is not a
regular file (a FIFO blocked for ever) is refused at once, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.spec import load_study
from tests.helpers import run_cli, write_study


@pytest.mark.parametrize(("text", "read_as"), [
    ("1:0", "60"), ("0x10", "16"), ("010", "8"), ("1_000", "1000"), ("0b11", "3")])
def test_a_yaml_1_1_number_is_refused_with_its_field(tmp_path: Path, text: str,
                                                     read_as: str) -> None:
    path = write_study(tmp_path / "s.yaml")
    path.write_text(path.read_text().replace("global_batch: 8", f"global_batch: {text}"))
    with pytest.raises(SpecError) as err:
        load_study(path)
    message = str(err.value)
    assert f"'{text}', a YAML 1.1 number (read as {read_as}" in message, message
    assert "(in training.global_batch)" in message, message


def test_decimal_numbers_and_quoted_text_still_load(tmp_path: Path) -> None:
    path = write_study(tmp_path / "s.yaml", trial={"warmup_steps": 0, "measure_steps": 2,
                                                   "timeout_s": 60.5, "device": "cpu"})
    spec = load_study(path)
    assert spec.training.global_batch == 8 and spec.trial.timeout_s == 60.5


def test_a_fifo_as_the_study_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "study.yaml"
    os.mkfifo(fifo)
    done = run_cli("plan", str(fifo), timeout=60)  # it blocked for ever (no writer)
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in done.stderr and "Traceback" not in done.stderr
