"""Verifiers and their TRL-style reward functions."""

from __future__ import annotations

import re
import threading

import pytest

from agents import verifiers as v

CHAT = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Answer: 1,000"}]


def test_it_checks_exact_answers() -> None:
    assert v.exact("Answer: Paris.", "paris") == 1.0
    assert v.exact("Answer: Paris", "Paris", case_sensitive=True) == 1.0
    assert v.exact("Answer: paris", "Paris", case_sensitive=True) == 0.0
    assert v.exact("Lyon", "Paris") == 0.0
    assert v.exact("  new   york ", "New York", extract=False) == 1.0


def test_it_checks_numbers_with_a_tolerance() -> None:
    assert v.numeric("Answer: 1,000", "1000") == 1.0
    assert v.numeric("so it is 3.0", 3) == 1.0
    assert v.numeric("Answer: 3.14159", "3.1416", tol=1e-3) == 1.0
    assert v.numeric("Answer: 3.2", "3.1416", tol=1e-3) == 0.0
    assert v.numeric("no idea", "3") == 0.0


def test_it_checks_math_equivalence() -> None:
    assert v.math_equiv("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert v.math_equiv("The result is $1+x^2$", "x^2+1") == 1.0
    assert v.math_equiv("The answer is 43", "42") == 0.0
    assert v.math_equiv("gibberish", "42") == 0.0


def test_it_checks_math_equivalence_off_the_main_thread() -> None:
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(v.math_equiv("\\boxed{2}", "2")))
    t.start()
    t.join()
    assert out == [1.0]


def test_it_matches_regexes() -> None:
    assert v.regex("The capital is Paris", r"Par\w+") == 1.0
    assert v.regex(" 123 ", r"\d+", fullmatch=True) == 1.0
    assert v.regex("a123", r"\d+", fullmatch=True) == 0.0


def test_it_checks_json() -> None:
    assert v.json_match('{"a": 1}') == 1.0
    assert v.json_match("Sure! ```json\n{\"a\": 1, \"b\": 2}\n```", required_keys=["a", "c"]) == 0.5
    assert v.json_match('here [1, 2] ok', expected=[1, 2]) == 1.0
    assert v.json_match('{"a": 1}', expected='{"a": 2}') == 0.0
    assert v.json_match("{not json}") == 0.0
    assert v.json_match("[1]", required_keys=["a"]) == 0.0


def test_it_runs_unit_tests_in_the_sandbox() -> None:
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    tests = "assert add(1, 2) == 3\nassert add(2, 2) == 5\nx = 1\nassert add(x, x) == 2\ndef test_neg():\n    assert add(-1, -1) == -2\n"
    assert v.unit_tests(code, tests) == 0.75
    report = v.run_unit_tests("def add(a, b):\n    return a + b\n", tests)
    assert (report.passed, report.total) == (3, 4)
    assert report.failures == ("assert add(2, 2) == 5  (AssertionError)",)
    assert "3/4 tests passed" in report.summary()


def test_it_scores_broken_or_cheating_code_zero() -> None:
    assert v.unit_tests("def add(a, b) return", "assert add(1, 2) == 3") == 0.0
    assert v.unit_tests("import sys\nsys.exit(0)", "assert add(1, 2) == 3") == 0.0
    cheat = "print('0 test 0 ok')\nimport os\nos._exit(0)"  # fake verdict lines without the nonce
    assert v.unit_tests(cheat, "assert add(1, 2) == 3") == 0.0
    assert v.run_unit_tests("def f(): pass", "def helper(): pass").error is not None  # no tests at all
    assert v.run_unit_tests("def f(): pass", "assert f( ==").total == 0


def test_it_counts_tests_passed_before_a_timeout() -> None:
    code = "def f(x):\n    while x > 5:\n        pass\n    return x\n"
    report = v.run_unit_tests(code, "assert f(1) == 1\nassert f(9) == 9\n", timeout_s=1.0)
    assert (report.passed, report.total) == (1, 2)
    assert report.error is not None and "timeout" in report.error


def test_it_builds_trl_style_reward_functions() -> None:
    completions = ["Answer: 1000", CHAT[1:], [{"role": "assistant", "content": "Answer: 7"}]]
    rewards = v.numeric_reward()(prompts=["p"] * 3, completions=completions, answer=["1000", "1000", "1000"])
    assert rewards == [1.0, 1.0, 0.0]
    assert v.numeric_answer(["p"], ["Answer: 5"], answer=[5]) == [1.0]
    assert v.exact_answer(prompts=["p"], completions=["Answer: yes"], answer=["Yes"]) == [1.0]
    assert v.math_answer(prompts=["p"], completions=["\\boxed{0.5}"], answer=["\\frac{1}{2}"]) == [1.0]
    assert v.regex_reward(r"^\d+$", fullmatch=True)(prompts=None, completions=["12", "a"]) == [1.0, 0.0]
    assert v.regex_reward()(prompts=None, completions=["abc"], pattern=["b"]) == [1.0]
    assert v.json_reward(required_keys=["a"])(prompts=None, completions=['{"a": 1}']) == [1.0]
    assert v.unit_tests_passed(prompts=None, completions=["def f():\n    return 1\n"], tests=["assert f() == 1"]) == [1.0]
    assert v.numeric_reward().__name__ == "numeric_reward"


def test_it_names_a_missing_column() -> None:
    with pytest.raises(KeyError, match="needs the dataset column 'answer'"):
        v.numeric_answer(prompts=["p"], completions=["1"], question=["q"])


def test_it_rejects_a_bad_pattern_up_front() -> None:
    with pytest.raises(re.error):
        v.regex_reward("(")
