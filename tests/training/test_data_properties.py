"""Property-based: generated files, good and bad, straight at `read_rows`. Whatever the bytes,
it returns rows that satisfy the declaration and can be stored (JSON, UTF-8), or raises a
DataError; nothing else escapes. Good rows written by `json` or `csv` read back unchanged.
Derandomized, so the suite never flakes."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.base import fields_of
from agents.envs import load_environment
from tests.training.bad_files import bad_files
from training.data import DataError, check_row, read_rows

PROPERTY = settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

FIELDS = {name: fields_of(load_environment(name)) for name in ("math_tool", "code_tests", "plan_path")}
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60)


def _read(content: bytes, filename: str, env: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / filename
        path.write_bytes(content)
        return read_rows(path, fields=FIELDS[env], max_rows=500, max_bytes=2_000_000)


@PROPERTY
@given(file=bad_files(), env=st.sampled_from(sorted(FIELDS)))
def test_any_file_gives_checked_rows_or_a_data_error(file: tuple[str, bytes], env: str) -> None:
    filename, content = file
    try:
        rows = _read(content, filename, env)
    except DataError as exc:
        assert exc.message and (exc.line is None or exc.line >= 1)
        return
    json.dumps(rows, ensure_ascii=False, allow_nan=False).encode("utf-8")  # what the database will store
    for row in rows:
        assert check_row(row, FIELDS[env]) == row  # what came out passes again, unchanged


math_rows = st.lists(st.fixed_dictionaries(
    {"question": TEXT.filter(lambda t: t != ""), "answer": st.integers(-10**6, 10**6).map(str) | st.floats(-1e6, 1e6).map(repr)},
    optional={"level": st.integers(1, 3), "notes": TEXT},
), min_size=1, max_size=8)


@PROPERTY
@given(rows=math_rows)
def test_rows_written_as_jsonl_read_back_unchanged(rows: list[dict[str, Any]]) -> None:
    content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    assert _read(content, "t.jsonl", "math_tool") == rows


@PROPERTY
@given(rows=math_rows)
def test_rows_written_by_the_csv_module_read_back_unchanged(rows: list[dict[str, Any]]) -> None:
    header = ["question", "answer", "level", "notes"]
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
    read = _read(buffer.getvalue().encode("utf-8"), "t.csv", "math_tool")
    assert read == [{"notes": "", **r} for r in rows]  # a missing level is an empty cell, which is no value
