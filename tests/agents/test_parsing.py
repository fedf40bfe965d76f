"""Pulling code, answers and numbers out of model text."""

from __future__ import annotations

import pytest

from agents.parsing import answer_number, extract_answer, extract_code, last_number, normalize_number, numbers_equal


def test_it_extracts_the_last_python_block() -> None:
    text = "First:\n```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\nand output\n```\n2\n```"
    assert extract_code(text) == "print(2)"


def test_it_falls_back_to_a_bare_block_and_to_an_unterminated_one() -> None:
    assert extract_code("```\nx = 1\n```") == "x = 1"
    assert extract_code("Here:\n```py\nprint(3)") == "print(3)"  # ran out of tokens


def test_it_ignores_other_languages_and_plain_text() -> None:
    assert extract_code("```bash\nls\n```") is None
    assert extract_code("print(1)") is None
    assert extract_code("```python\n\n```") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 42", "42"),
        ("so the answer is 17.", "17"),
        ("The answer is: 7", "7"),
        ("Final answer: **19**", "19"),
        ("We get \\boxed{\\frac{1}{2}} in the end", "\\frac{1}{2}"),
        ("\\boxed{42} ... Answer: 41", "42"),  # boxed wins
        ("I think it is 3, no, 5", "5"),  # last number
        ("Answer: $-2.50$", "-2.50"),
        ("no numbers here", None),
    ],
)
def test_it_extracts_the_final_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1,000", 1000), ("3.0", 3), ("-2.5", -2.5), ("$1,234.50", 1234.5), ("3/4", 0.75), ("\\frac{3}{4}", 0.75),
     ("50%", 50), ("1e3", 1000), ("7.", 7), ("abc", None), ("1,2,3", None), ("", None), ("1/0", None),
     ("+45", 45), ("+4.5e1", 45)],
)
def test_it_normalises_numbers(text: str, expected: float | None) -> None:
    value = normalize_number(text)
    assert value == expected
    if expected is not None and float(expected).is_integer():
        assert isinstance(value, int)


def test_it_refuses_a_chain_of_fractions_without_recursing_once_per_slash() -> None:
    assert normalize_number("1/" * 5000 + "1") is None  # an uploaded answer; this used to be a RecursionError


def test_it_reads_a_numeric_answer() -> None:
    assert answer_number("Answer: 12 + 7 = 19") == 19
    assert answer_number("The answer is 42 apples") == 42
    assert answer_number("so 12 - 7 = 5") == 5
    assert answer_number("x") is None
    assert last_number("from 3 to -4") == "-4"
    assert last_number("12-7") == "7"  # a subtraction: the minus belongs to no number


def test_it_compares_numbers_with_a_tolerance() -> None:
    assert numbers_equal(3, 3.0000000001)
    assert not numbers_equal(3, 3.01)
    assert numbers_equal(1e12, 1e12 + 1)
    assert not numbers_equal(None, 3)
