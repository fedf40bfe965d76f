"""Typed rows: `read_rows` checks every row against the environment's declared fields: scalars
where scalars are meant, CSV cells converted by kind, unique CSV headers and JSON keys, and
fields an environment does not use kept as metadata. Errors name the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.base import RowField, fields_of
from agents.envs import load_environment
from tests.agents.example_plugin import EchoEnv
from training.data import DataError, read_rows

MATH = fields_of(load_environment("math_tool"))
CODE = fields_of(load_environment("code_tests"))


def read(tmp_path: Path, name: str, content: str | bytes, fields=MATH) -> list[dict]:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return read_rows(path, fields=fields)


def refused(tmp_path: Path, name: str, content: str | bytes, fields=MATH) -> str:
    with pytest.raises(DataError) as info:
        read(tmp_path, name, content, fields)
    return str(info.value)


@pytest.mark.parametrize(("value", "got"), [('{"a": 1}', "an object"), ("[1]", "a list"), ("[]", "a list"), ("true", "true/false")])
def test_it_refuses_an_answer_that_is_not_a_number_or_text(tmp_path: Path, value: str, got: str) -> None:
    content = '{"question": "1+1?", "answer": "2"}\n' f'{{"question": "2+2?", "answer": {value}}}\n'
    assert refused(tmp_path, "t.jsonl", content) == f"line 2: field 'answer' must be a number or text, got {got}"


def test_it_refuses_an_answer_that_is_text_but_no_number(tmp_path: Path) -> None:
    message = refused(tmp_path, "t.jsonl", '{"question": "1+1?", "answer": "two"}\n')
    assert message.startswith("line 1: field 'answer' must be a number") and "'two'" in message


def test_it_accepts_numbers_and_numeric_text_as_answers(tmp_path: Path) -> None:
    rows = read(tmp_path, "t.jsonl", "".join(f'{{"question": "q", "answer": {a}}}\n' for a in ['"42"', "3.5", "-7", '"1,234"', '"3/4"', '" 5 "']))
    assert [r["answer"] for r in rows] == ["42", 3.5, -7, "1,234", "3/4", " 5 "]  # kept as given; compared numerically


def test_it_refuses_a_question_that_is_not_text(tmp_path: Path) -> None:
    assert refused(tmp_path, "t.jsonl", '{"question": ["a"], "answer": "1"}\n') == "line 1: field 'question' must be text, got a list"
    assert refused(tmp_path, "t.jsonl", '{"question": 12, "answer": "1"}\n') == "line 1: field 'question' must be text, got a number (12)"


def test_it_converts_csv_cells_to_their_kind(tmp_path: Path) -> None:
    rows = read(tmp_path, "t.csv", 'question,answer,level\nq1,3.5,2\nq2,-4,\n')
    assert rows == [{"question": "q1", "answer": "3.5", "level": 2}, {"question": "q2", "answer": "-4"}]  # an empty cell is no value
    rows = read(tmp_path, "t.csv", 'prompt,reference,hidden_tests,mutants\np,r,t,"[""a"", ""b""]"\np,r,t,def f(): pass\n', CODE)
    assert [r["mutants"] for r in rows] == [["a", "b"], ["def f(): pass"]]


@pytest.mark.parametrize(("kind", "cell", "value"), [
    ("int", "+7", 7), ("int", " 12 ", 12), ("float", "3.5", 3.5), ("float", "1e3", 1000.0), ("float", "-.5", -0.5),
    ("bool", "true", True), ("bool", "No", False), ("bool", "1", True), ("number", "1,234", "1,234"), ("text", " x ", " x "),
])
def test_it_reads_each_kind_from_a_csv_cell(tmp_path: Path, kind: str, cell: str, value: object) -> None:
    assert read(tmp_path, "t.csv", f'v\n"{cell}"\n', {"v": RowField(kind)}) == [{"v": value}]  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "cell", "says"), [
    ("int", "3.5", "a whole number"), ("int", "nan", "a whole number"), ("float", "inf", "a number"), ("float", "1_000", "a number"),
    ("bool", "maybe", "true or false"), ("number", "abc", "a number"), ("text_list", "[1, 2]", "item 1 must be text"),
    ("text_list", "[oops", "not valid JSON"),
])
def test_it_refuses_a_csv_cell_that_is_not_its_kind(tmp_path: Path, kind: str, cell: str, says: str) -> None:
    message = refused(tmp_path, "t.csv", f'v\n"{cell}"\n', {"v": RowField(kind)})  # type: ignore[arg-type]
    assert message.startswith("line 2: field 'v'") and says in message


@pytest.mark.parametrize(("kind", "value", "got"), [
    ("int", "3.0", "a number (3.0)"), ("int", "true", "true/false"), ("int", '"3"', "text ('3')"), ("float", "false", "true/false"),
    ("bool", "1", "a number (1)"), ("text_list", '{"a": "b"}', "an object"), ("scalar", '{"a": 1}', "an object"),
    ("scalar", "[1]", "a list"), ("text", '{"a": 1}', "an object"),
])
def test_it_refuses_a_json_value_of_another_kind(tmp_path: Path, kind: str, value: str, got: str) -> None:
    message = refused(tmp_path, "t.jsonl", f'{{"v": {value}}}\n', {"v": RowField(kind)})  # type: ignore[arg-type]
    assert message.startswith("line 1: field 'v' must be") and message.endswith(f"got {got}")


def test_it_refuses_a_repeated_csv_header_naming_the_column(tmp_path: Path) -> None:
    message = refused(tmp_path, "t.csv", "question,answer,answer\nq,1,2\n")
    assert message == "line 1: the CSV header repeats column 'answer'; column names must be unique"
    assert "'answer'" in refused(tmp_path, "t.csv", "question, answer,answer \nq,1,2\n")  # the same name once spaces go


def test_it_refuses_a_repeated_json_key(tmp_path: Path) -> None:
    message = refused(tmp_path, "t.jsonl", '{"question": "q", "answer": "1", "answer": {"x": 1}}\n')
    assert message == "line 1: invalid JSON: field 'answer' appears twice"


def test_it_names_the_missing_field_before_any_type(tmp_path: Path) -> None:
    assert refused(tmp_path, "t.jsonl", '{"answer": {"a": 1}}\n') == "line 1: missing required field(s) question"
    assert refused(tmp_path, "t.jsonl", '{"question": "q", "answer": null}\n') == "line 1: empty required field(s) answer"
    assert refused(tmp_path, "t.jsonl", '{"question": "", "answer": "1"}\n') == "line 1: empty required field(s) question"


def test_a_file_for_another_environment_is_one_line(tmp_path: Path) -> None:
    """Twenty rows without `question` (a grid file under math) say it once, not twenty times."""
    rows = "".join('{"grid": "..#", "start": [0, 0], "goal": [0, 2]}\n' for _ in range(25))
    message = refused(tmp_path, "t.jsonl", rows)
    assert message.startswith("no row has `question`, `answer`: is this the right environment?"), message
    assert "line" not in message
    mixed = '{"grid": "..#"}\n{"question": "q", "answer": "1"}\n{"grid": "#"}\n'  # some rows fit: each bad line is said
    assert refused(tmp_path, "t.jsonl", mixed).startswith("2 problems: line 1: missing required field(s) question, answer")


def test_it_keeps_undeclared_scalars_and_shallow_metadata(tmp_path: Path) -> None:
    row = '{"question": "q", "answer": "1", "source": "gsm8k", "n": 3, "ok": true, "tags": ["a", "b"], "meta": {"by": "ana", "ids": [1, 2]}}\n'
    assert read(tmp_path, "t.jsonl", row)[0]["meta"] == {"by": "ana", "ids": [1, 2]}


def test_it_refuses_undeclared_fields_nested_deeper_than_metadata(tmp_path: Path) -> None:
    message = refused(tmp_path, "t.jsonl", '{"question": "q", "answer": "1", "meta": {"a": {"b": [1]}}}\n')
    assert message.startswith("line 1: field 'meta' is nested deeper than 2 levels")


def test_it_checks_an_old_protocol_environments_fields_as_scalars(tmp_path: Path) -> None:
    fields = fields_of(EchoEnv)
    assert read(tmp_path, "t.jsonl", '{"word": "hi"}\n{"word": 3}\n', fields) == [{"word": "hi"}, {"word": 3}]
    assert refused(tmp_path, "t.jsonl", '{"word": "hi"}\n{"word": {"a": 1}}\n', fields) == (
        "line 2: field 'word' must be text, a number or true/false, got an object")
    assert refused(tmp_path, "t.jsonl", '{"word": ["hi"]}\n', fields).endswith("got a list")


def test_required_fields_alone_still_work(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(DataError, match="line 1: missing required field.s. answer"):
        read_rows(path, required_fields=("question", "answer"))
    path.write_text('{"question": "q", "answer": [1]}\n')
    with pytest.raises(DataError, match="field 'answer' must be text, a number or true/false, got a list"):
        read_rows(path, required_fields=("question", "answer"))
