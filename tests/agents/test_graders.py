"""Graders defined as data (`agents.graders`): each kind scores and gives its parts; a set is
checked before it is stored; a hostile Python grader fails its own grades with the reason and
nothing else (one sandbox process per batch)."""

from __future__ import annotations

import pytest

from agents.graders import GraderError, Item, check_graders, grade_all, grade_batch

ROWS = [Item("Work. Answer: 42", {"answer": "42"}), Item("answer: forty", {"answer": "42"}), Item('Here: {"a": 1}', {"answer": "7"})]


def scores(grades):
    return [(g.score, g.error) for g in grades]


def test_it_scores_each_built_in_kind_with_its_parts():
    graders = check_graders({
        "exact": {"kind": "exact"},
        "loose": {"kind": "normalized", "extract": False, "ignore_punctuation": True},
        "digits": {"kind": "regex", "pattern": r"\d+"},
        "near": {"kind": "number", "tolerance": 0.1, "relative": True},
        "shape": {"kind": "json_schema", "schema": {"type": "object", "required": ["a"]}},
        "both": {"kind": "combination", "weights": {"exact": 0.75, "digits": 0.25}},
    })
    got = grade_all(graders, ROWS)
    assert scores(got["exact"]) == [(1.0, None), (0.0, None), (0.0, None)]
    assert scores(got["digits"]) == [(1.0, None), (0.0, None), (1.0, None)]
    assert [g.score for g in got["near"]] == [1.0, 0.0, 0.0]  # "Here: 1" vs 7: 10 % of 7 is 0.7
    assert [(g.score, g.parts) for g in got["shape"]][2] == (1.0, {"parsed": 1.0, "valid": 1.0})
    assert got["shape"][0].parts == {"parsed": 0.0, "valid": 0.0}
    assert (got["both"][0].score, got["both"][0].parts) == (1.0, {"exact": 1.0, "digits": 1.0})
    assert got["both"][2].score == 0.25
    assert grade_batch(check_graders({"loose": {"kind": "normalized", "extract": False, "ignore_punctuation": True}}), "loose",
                       [Item("  Paris, France!", {"answer": "paris france"})])[0].score == 1.0


def test_a_missing_column_is_a_grade_error_not_a_crash():
    graders = check_graders({"exact": {"kind": "exact", "column": "gold"}})
    (grade,) = grade_batch(graders, "exact", [Item("Answer: 1", {"answer": "1"})])
    assert not grade.ok and "no column 'gold'" in grade.error and "answer" in grade.error


@pytest.mark.parametrize(("graders", "field", "says"), [
    ({}, "graders", "at least one"),
    ({"1bad": {"kind": "exact"}}, "graders", "not a grader name"),
    ({"g": {"kind": "fuzzy"}}, "graders.g.kind", "must be one of"),
    ({"g": {"kind": "regex", "pattern": "("}}, "graders.g.pattern", "not a regular expression"),
    ({"g": {"kind": "exact", "patern": "x"}}, "graders.g", "not patern"),
    ({"g": {"kind": "json_schema", "schema": {"type": "nope"}}}, "graders.g.schema", "not a valid JSON Schema"),
    ({"g": {"kind": "python", "code": "def grade(c, r):\n  return ("}}, "graders.g.code", "does not parse"),
    ({"g": {"kind": "python", "code": "def score(c, r): return 1"}}, "graders.g.code", "grade(completion, row)"),
    ({"g": {"kind": "python", "code": "def grade(c, r): return 1", "timeout_s": 60}}, "graders.g.timeout_s", "at most 10"),
    ({"g": {"kind": "number", "tolerance": -1}}, "graders.g.tolerance", "at least 0"),
    ({"a": {"kind": "combination", "weights": {"b": 1}}, "b": {"kind": "combination", "weights": {"a": 1}}}, "graders.a.weights", "circle"),
    ({"a": {"kind": "combination", "weights": {"zz": 1}}}, "graders.a.weights", "not a grader of this set"),
])
def test_it_refuses_a_bad_set_naming_the_field(graders, field, says):
    with pytest.raises(GraderError) as caught:
        check_graders(graders)
    assert caught.value.field == field and says in caught.value.message


def python(code, timeout_s=1.0):
    return check_graders({"g": {"kind": "python", "code": code, "timeout_s": timeout_s}})


def test_a_python_grader_gets_the_row_and_earlier_turns_and_returns_parts():
    graders = python(
        "def grade(completion, row, turns):\n"
        "    print('chatter is ignored')\n"
        "    right = 1.0 if row['answer'] in completion else 0.0\n"
        "    return {'score': right + 0.5 * len(turns), 'parts': {'right': right, 'turns': len(turns)}}\n"
    )
    items = [Item("Answer: 42", {"answer": "42"}, (("answerer", "42"),)), Item("no", {"answer": "42"})]
    got = grade_batch(graders, "g", items)
    assert [(g.score, g.parts, g.error) for g in got] == [(1.5, {"right": 1.0, "turns": 1.0}, None), (0.0, {"right": 0.0, "turns": 0.0}, None)]


HOSTILE = {
    "an infinite loop": ("def grade(c, r):\n    while True:\n        pass", "took longer than 1 s"),
    "a loop that swallows the timer": ("def grade(c, r):\n    while True:\n        try:\n            while True: pass\n"
                                       "        except BaseException: pass", "longer than"),
    "a fork bomb": ("import os\ndef grade(c, r):\n    while True: os.fork()", "blocked in the sandbox"),
    "reading a file": ("def grade(c, r):\n    return len(open('/etc/passwd').read())", "blocked in the sandbox: reading"),
    "the network": ("import socket\ndef grade(c, r):\n    socket.create_connection(('127.0.0.1', 80))\n    return 1", "blocked in the sandbox"),
    "returning NaN": ("def grade(c, r):\n    return float('nan')", "not a finite number"),
    "returning text": ("def grade(c, r):\n    return 'yes'", "not a number"),
    "huge output": ("import os\ndef grade(c, r):\n    os.write(1, b'x' * 10_000_000)\n    return 1", "output limit"),
    "huge parts": ("def grade(c, r):\n    return 1, {str(i): 1 for i in range(100_000)}", "the limit is 16"),
    "memory": ("def grade(c, r):\n    return len(bytearray(2 * 1024 ** 3))", "MemoryError"),
    "raising at import": ("raise SystemExit(3)\ndef grade(c, r):\n    return 1", "the grader's code failed"),
}


@pytest.mark.parametrize("what", list(HOSTILE))
def test_a_hostile_python_grader_fails_its_grades_with_the_reason(what):
    code, says = HOSTILE[what]
    got = grade_batch(python(code), "g", [Item("Answer: 1", {"answer": "1"}), Item("Answer: 2", {"answer": "1"})])
    assert all(not g.ok and says in g.error for g in got), [g.error for g in got]
