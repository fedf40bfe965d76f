"""Row-field declarations: every built-in declares the type of each field its rows hold, its
generator's rows satisfy the declaration (as JSONL and as CSV), `required_fields` follows from
it, and an environment written for the old protocol still works (its fields as scalars)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from agents.base import RowField, fields_of, required_of
from agents.envs import BUILTIN, list_environments, load_environment
from tests.agents.example_plugin import EchoEnv
from training.data import read_rows

NAMES = sorted(BUILTIN)


@pytest.mark.parametrize("name", NAMES)
def test_it_declares_every_field_the_generator_writes(name: str) -> None:
    env = load_environment(name)
    declared = env.row_fields  # type: ignore[attr-defined]
    assert declared and all(isinstance(f, RowField) for f in declared.values())
    for row in env.generate(20, seed=4):
        assert set(row) <= set(declared), set(row) - set(declared)


@pytest.mark.parametrize("name", NAMES)
def test_it_derives_required_fields_from_the_declaration(name: str) -> None:
    cls = BUILTIN[name]
    assert cls.required_fields == required_of(cls.row_fields)
    assert fields_of(cls) == cls.row_fields


@pytest.mark.parametrize("name", NAMES)
def test_its_generated_rows_read_back_unchanged_from_jsonl_and_csv(name: str, tmp_path: Path) -> None:
    env = load_environment(name)
    rows = env.generate(12, seed=9)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_rows(tmp_path / "rows.jsonl", fields=fields_of(env)) == rows

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows({k: v if isinstance(v, str) else json.dumps(v) for k, v in r.items()} for r in rows)
    (tmp_path / "rows.csv").write_text(buffer.getvalue())
    assert read_rows(tmp_path / "rows.csv", fields=fields_of(env)) == rows  # "3" -> 3, '["..."]' -> a list


def test_it_declares_what_each_field_really_is() -> None:
    assert BUILTIN["math_tool"].row_fields["answer"].kind == "number"  # compared numerically
    assert BUILTIN["arithmetic"].row_fields["answer"].kind == "number"
    assert BUILTIN["plan_path"].row_fields["grid"].kind == "text"  # reset parses one text, not a list of rows
    assert BUILTIN["code_tests"].row_fields["mutants"].kind == "text_list"
    env = load_environment("plan_path")
    with pytest.raises(ValueError, match="grid cells"):
        env.reset({"grid": ["S.", ".G"]}, task_id="t", roles=env.roles)  # why the grid is not a list


def test_an_old_protocol_environment_gets_its_required_fields_as_scalars() -> None:
    assert not hasattr(EchoEnv, "row_fields")
    assert fields_of(EchoEnv) == {"word": RowField("scalar")}
    assert fields_of(EchoEnv(times=2)) == {"word": RowField("scalar")}


def test_required_fields_win_over_an_optional_declaration() -> None:
    class Both:
        required_fields = ("a",)
        row_fields = {"a": RowField("int", required=False), "b": RowField("text", required=False)}

    assert fields_of(Both) == {"a": RowField("int"), "b": RowField("text", required=False)}


def test_it_refuses_a_declaration_that_is_not_row_fields() -> None:
    class Wrong:
        name = "wrong"
        required_fields = ("a",)
        row_fields = {"a": "int"}

    with pytest.raises(ValueError, match="row_fields must map field names to agents.base.RowField"):
        fields_of(Wrong)


def test_the_environment_list_carries_the_declarations() -> None:
    infos = {i.name: i for i in list_environments()}
    assert infos["code_tests"].row_fields["mutants"].label == "a list of text"
    assert infos["math_tool"].row_fields["level"].required is False
