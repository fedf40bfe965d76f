"""Bounded rows: text per field, fields per row, field names, list items, nesting, extra fields,
rows and bytes each have a named limit, and a refusal names the limit and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.base import RowField, fields_of
from agents.envs import load_environment
from training import data
from training.data import DataError, read_rows

MATH = fields_of(load_environment("math_tool"))
CODE = fields_of(load_environment("code_tests"))


def refused(tmp_path: Path, name: str, content: str, fields=MATH, **limits) -> str:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_rows(path, fields=fields, **limits)
    return str(info.value)


def jsonl(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_the_limits_are_named_constants() -> None:
    assert (data.MAX_FIELD_CHARS, data.MAX_FIELDS, data.MAX_JSON_DEPTH, data.MAX_EXTRA_DEPTH) == (20_000, 64, 20, 2)
    assert (data.MAX_LIST_ITEMS, data.MAX_FIELD_NAME_CHARS, data.MAX_NUMBER_CHARS) == (256, 100, 100)


def test_it_bounds_a_text_field_naming_it_and_the_limit(tmp_path: Path) -> None:
    row = {"question": "x" * (data.MAX_FIELD_CHARS + 1), "answer": "1"}
    assert refused(tmp_path, "t.jsonl", jsonl({"question": "q", "answer": "1"}, row)) == (
        "line 2: field 'question' is 20,001 characters; the limit is 20,000")
    assert refused(tmp_path, "t.csv", f"question,answer\n{'y' * 20_001},1\n").startswith("line 2: field 'question' is 20,001")


def test_a_text_field_at_the_limit_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(jsonl({"question": "x" * data.MAX_FIELD_CHARS, "answer": "1"}))
    assert len(read_rows(path, fields=MATH)[0]["question"]) == data.MAX_FIELD_CHARS


def test_an_environment_may_declare_a_smaller_limit(tmp_path: Path) -> None:
    grid = "S" + "." * 2_000 + "G"
    message = refused(tmp_path, "t.jsonl", jsonl({"grid": grid}), fields_of(load_environment("plan_path")))
    assert message == "line 1: field 'grid' is 2,002 characters; the limit is 2,000"


def test_it_bounds_the_text_of_a_number(tmp_path: Path) -> None:
    message = refused(tmp_path, "t.jsonl", jsonl({"question": "q", "answer": "." * 5_000 + "1"}))
    assert message == "line 1: field 'answer' is 5,001 characters; the limit is 100"


def test_it_bounds_fields_per_row(tmp_path: Path) -> None:
    row = {"question": "q", "answer": "1", **{f"f{i}": i for i in range(data.MAX_FIELDS)}}
    assert refused(tmp_path, "t.jsonl", jsonl(row)) == "line 1: 66 fields; the limit is 64 per row"
    header = ",".join(["question", "answer", *(f"f{i}" for i in range(data.MAX_FIELDS))])
    assert refused(tmp_path, "t.csv", header + "\n") == "line 1: the CSV header has 66 columns; the limit is 64"


def test_it_bounds_field_names(tmp_path: Path) -> None:
    message = refused(tmp_path, "t.jsonl", jsonl({"question": "q", "answer": "1", "n" * 101: 1}))
    assert message == "line 1: a field name is 101 characters; the limit is 100"
    assert refused(tmp_path, "t.jsonl", jsonl({"question": "q", "answer": "1", "": 1})) == "line 1: a field has an empty name"


def test_it_bounds_list_items_and_each_item(tmp_path: Path) -> None:
    row = {"prompt": "p", "reference": "r", "hidden_tests": "t", "mutants": ["m"] * (data.MAX_LIST_ITEMS + 1)}
    assert refused(tmp_path, "t.jsonl", jsonl(row), CODE) == "line 1: field 'mutants' has 257 items; the limit is 256"
    row["mutants"] = ["ok", "z" * 20_001]
    assert refused(tmp_path, "t.jsonl", jsonl(row), CODE) == "line 1: field 'mutants' item 2 is 20,001 characters; the limit is 20,000"


@pytest.mark.parametrize(("extra", "says"), [
    ({"meta": {"a": {"b": [1]}}}, "field 'meta' is nested deeper than 2 levels"),
    ({"meta": "m" * 20_001}, "field 'meta' is 20,001 characters; the limit is 20,000"),
    ({"meta": ["m" * 5_000] * 5}, "field 'meta' is 25,"),
    ({"meta": list(range(300))}, "field 'meta' has 300 items; the limit is 256"),
    ({"meta": 10**400}, "field 'meta' is not a finite number (a 401-digit number)"),
    ({"meta": {"k": 10**400}}, "field 'meta' is not a finite number"),
])
def test_it_bounds_fields_the_environment_does_not_declare(tmp_path: Path, extra: dict, says: str) -> None:
    message = refused(tmp_path, "t.jsonl", jsonl({"question": "q", "answer": "1", **extra}))
    assert message.startswith(f"line 1: {says}")


def test_it_bounds_whole_numbers(tmp_path: Path) -> None:
    message = refused(tmp_path, "t.jsonl", jsonl({"v": 2**63}), {"v": RowField("int")})
    assert message == "line 1: field 'v' is 9223372036854775808; the limit is 9,223,372,036,854,775,807"


def test_it_bounds_rows_and_bytes(tmp_path: Path) -> None:
    rows = jsonl(*({"question": f"q{i}", "answer": str(i)} for i in range(5)))
    assert refused(tmp_path, "t.jsonl", rows, max_rows=4) == "more than 4 rows"
    assert refused(tmp_path, "t.jsonl", rows, max_bytes=100) == f"file is {len(rows):,} bytes; the limit is 100"
