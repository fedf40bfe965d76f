"""Whatever a parser makes of a file (recursion, encodings, NUL bytes, surrogates, oversize or
broken CSV cells, stray carriage returns), `read_rows` answers with a line-numbered DataError and
never lets another exception out."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.base import fields_of
from agents.envs import load_environment
from training.data import MAX_JSON_DEPTH, DataError, read_rows

MATH = fields_of(load_environment("math_tool"))
GOOD = b'{"question": "1+1?", "answer": "2"}\n'


def refused(tmp_path: Path, name: str, content: bytes) -> DataError:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        read_rows(path, fields=MATH)
    return info.value


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000, 200_000])
def test_it_refuses_deep_nesting_without_a_recursion_error(tmp_path: Path, depth: int) -> None:
    line = b'{"question": "q", "answer": "1", "x": ' + b"[" * depth + b"]" * depth + b"}\n"
    error = refused(tmp_path, "t.jsonl", GOOD + line)
    assert str(error) == f"line 2: nested deeper than {MAX_JSON_DEPTH} levels"


def test_it_refuses_nul_bytes_anywhere_in_the_file(tmp_path: Path) -> None:
    error = refused(tmp_path, "t.jsonl", GOOD * 2000 + b'{"question": "a\x00b", "answer": "1"}\n')  # well past the first 8 KB
    assert error.line == 2001 and "NUL" in error.message


def test_it_refuses_a_nul_character_written_as_a_json_escape(tmp_path: Path) -> None:
    error = refused(tmp_path, "t.jsonl", GOOD + b'{"question": "a\\u0000b", "answer": "1"}\n')
    assert str(error) == "line 2: field 'question' contains a NUL character"


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udfff", b"x\\udc80y"])
def test_it_refuses_a_lone_surrogate(tmp_path: Path, escape: bytes) -> None:
    error = refused(tmp_path, "t.jsonl", GOOD + b'{"question": "' + escape + b'", "answer": "1"}\n')
    assert error.line == 2 and "field 'question' contains a lone surrogate" in error.message


def test_it_refuses_a_lone_surrogate_in_a_field_name(tmp_path: Path) -> None:
    error = refused(tmp_path, "t.jsonl", b'{"question": "q", "answer": "1", "\\ud800": 1}\n')
    assert str(error).startswith("line 1: a field name contains a lone surrogate")


@pytest.mark.parametrize(("encoding", "says"), [("latin-1", "not valid UTF-8"), ("cp1252", "not valid UTF-8"),
                                                ("utf-16", "UTF-16"), ("utf-32", "UTF-32")])
def test_it_names_a_file_that_is_not_utf8(tmp_path: Path, encoding: str, says: str) -> None:
    content = "question,answer\nQu'est-ce que 1+1 \u00e0 la caf\u00e9?,2\n".encode(encoding)
    assert says in str(refused(tmp_path, "t.csv", content))


def test_it_names_the_line_of_a_byte_that_is_not_utf8(tmp_path: Path) -> None:
    assert refused(tmp_path, "t.jsonl", GOOD * 3 + '{"question": "caf\u00e9", "answer": "1"}\n'.encode("latin-1")).line == 4


def test_it_refuses_a_csv_cell_larger_than_the_csv_modules_limit(tmp_path: Path) -> None:
    error = refused(tmp_path, "t.csv", b"question,answer\nq,1\n" + b"x" * 200_000 + b",1\n")
    assert str(error) == "line 3: a cell is longer than the limit of 20,000 characters"


def test_it_refuses_a_carriage_return_inside_an_unquoted_cell(tmp_path: Path) -> None:
    error = refused(tmp_path, "t.csv", b"question,answer\nq,1\nwhat\ris it,2\n")
    assert error.line == 3 and "line break (\\r) inside an unquoted cell" in error.message


def test_it_keeps_a_carriage_return_inside_a_quoted_cell_and_reads_crlf_files(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b'question,answer\r\n"two\r\nlines",1\r\nq,2\r\n')
    assert read_rows(path, fields=MATH) == [{"question": "two\r\nlines", "answer": "1"}, {"question": "q", "answer": "2"}]


@pytest.mark.parametrize(("content", "line", "says"), [
    (b'question,answer\nq,1\n"unterminated,2\n', 3, "invalid CSV"),
    (b'question,answer\n"q"x,1\n', 2, "invalid CSV"),
    (b"question,answer\nq,1\nq,1,3\n", 3, "more cells than header columns"),
    (b"question,answer,level\nq,1,2\nq,1\n", 3, "fewer cells than header columns"),
])
def test_it_names_the_line_of_a_broken_csv_row(tmp_path: Path, content: bytes, line: int, says: str) -> None:
    error = refused(tmp_path, "t.csv", content)
    assert error.line == line and says in error.message


@pytest.mark.parametrize(("value", "says"), [(b"NaN", "NaN is not a number JSON allows"), (b"-Infinity", "-Infinity"),
                                             (b"1e999", "not a finite number (inf)"), (b"9" * 5000, "more than 4,300 digits")])
def test_it_refuses_numbers_that_are_no_numbers(tmp_path: Path, value: bytes, says: str) -> None:
    error = refused(tmp_path, "t.jsonl", b'{"question": "q", "answer": ' + value + b"}\n")
    assert error.line == 1 and says in error.message


def test_it_reads_a_line_separator_inside_a_json_string(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "a\u2028b\u0085c", "answer": "1"}\r\n{"question": "q", "answer": "2"}\n', encoding="utf-8")
    assert [r["question"] for r in read_rows(path, fields=MATH)] == ["a\u2028b\u0085c", "q"]  # only \n ends a JSONL line


def test_it_refuses_a_raw_control_character_in_a_json_string(tmp_path: Path) -> None:
    error = refused(tmp_path, "t.jsonl", GOOD + b'{"question": "a\rb", "answer": "1"}\n')
    assert error.line == 2 and "invalid JSON" in error.message


def test_a_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read the file"):
        read_rows(tmp_path / "nope.jsonl", fields=MATH)
