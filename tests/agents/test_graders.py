"""Graders defined as data (`agents.graders`): each kind scores and gives its parts; a set is
checked before it is stored; a hostile Python grader fails its own grades with the reason and
nothing else; a run's Python grader is one sandbox process reused across batches, replaced only
after a candidate it hung on, and gone once closed."""

from __future__ import annotations

import pytest

import agents.graders
from agents.graders import GraderError, GraderWorkers, Item, check_graders, grade_all, grade_batch
from tests.agents.sandbox_procs import gone

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


def test_a_python_grader_is_one_process_for_every_group_of_a_step_and_none_after_close(spawned):
    graders = python("def grade(c, r):\n    return float(c == r['answer'])")
    with GraderWorkers() as workers:
        groups = [[Item(str(a), {"answer": str(g)}) for a in range(3)] for g in range(3)]  # 3 states x K=3 candidates
        got = [scores(grade_batch(graders, "g", items, workers)) for items in groups]
        assert got == [[(1.0 if a == g else 0.0, None) for a in range(3)] for g in range(3)]
        assert len(spawned) == 1 and workers.started == 1 and not gone(spawned[0])
    assert gone(spawned[0])


def test_a_hanging_candidate_fails_alone_and_the_next_gets_a_fresh_worker(spawned):
    graders = python("import signal\ndef grade(c, r):\n    if c == 'hang':\n"  # its own timer ignored: the parent must stop it
                     "        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n        while True: pass\n    return len(c)", timeout_s=0.5)
    with GraderWorkers() as workers:
        got = grade_batch(graders, "g", [Item("ab", {}), Item("hang", {}), Item("abc", {}), Item("abcd", {})], workers)
        assert [g.score for g in got] == [2.0, 0.0, 3.0, 4.0]
        assert [g.ok for g in got] == [True, False, True, True] and "took longer than 0.5 s" in got[1].error
        assert len(spawned) == 2 and gone(spawned[0]) and not gone(spawned[1])
    assert all(gone(p) for p in spawned)


def test_a_worker_is_replaced_before_its_life_cpu_limit_could_stop_a_grader(spawned, monkeypatch):
    monkeypatch.setattr(agents.graders, "WORKER_CPU_S", 3)  # room for about 2 completions of 0.3 s at timeout 0.5 s
    graders = python("import time\ndef grade(c, r):\n    time.sleep(0.3)\n    return 1", timeout_s=0.5)
    with GraderWorkers() as workers:
        got = grade_batch(graders, "g", [Item(str(i), {}) for i in range(3)], workers)
        assert [g.error for g in got] == [None] * 3 and workers.started >= 2 and len(spawned) == workers.started
    assert all(gone(p) for p in spawned)
