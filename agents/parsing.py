"""Pull code, answers and numbers out of what a model wrote.

Small models are sloppy, so the readers are lenient in a fixed, documented order:
`extract_answer` tries `\\boxed{...}`, then "Answer: ..." / "answer is ...", then the last
number; `extract_code` takes the last ```python block, then the last bare ``` block, then an
unterminated trailing block.
"""

from __future__ import annotations

import re

Number = int | float

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}

# A number: 1,234.5 (comma groups of three), 12.5, .5, 1e-3, 3/4; a minus only where it cannot be
# a subtraction (not right after a digit, letter or closing bracket).
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+)"
_NUMBER = re.compile(rf"(?<![\w.)\]])-?{_UNSIGNED}(?:\s*/\s*{_UNSIGNED})?")
_ANSWER = re.compile(r"(?:final\s+answer|answer)\s*(?:is\s*:|is|:|=)\s*(.+)", re.IGNORECASE)
_FRAC = re.compile(r"\\[dt]?frac\{\s*(-?[\d.]+)\s*\}\{\s*(-?[\d.]+)\s*\}")


def extract_code(text: str) -> str | None:
    """The last ```python block; else the last untagged ``` block; None when there is neither.

    A final block whose closing fence is missing (the model ran out of tokens) still counts.
    """
    python: list[str] = []
    bare: list[str] = []
    for match in _FENCE.finditer(text):
        tag, body = match.group(1).lower(), match.group(2)
        if tag in _PYTHON_TAGS:
            python.append(body)
        elif tag == "":
            bare.append(body)
    blocks = python or bare
    if not blocks:
        return None
    code = blocks[-1].strip("\n")
    return code if code.strip() else None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i != -1 and text[start + len("\\boxed") : i].strip() == "":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def _clean(answer: str) -> str:
    answer = answer.strip()
    answer = re.sub(r"^[*_`$\s]+|[*_`$\s]+$", "", answer)  # markdown bold, code, inline math
    answer = re.sub(r"^\\\(|\\\)$", "", answer).strip()
    return answer.rstrip(".").strip()


def extract_answer(text: str) -> str | None:
    """The final answer in `text`, as a string: `\\boxed{42}` > "Answer: 42" > "answer is 42" > last number."""
    boxed = _last_boxed(text)
    if boxed:
        return _clean(boxed)
    matches = list(_ANSWER.finditer(text))
    if matches:
        line = matches[-1].group(1).split("\n")[0]
        cleaned = _clean(line)
        if cleaned:
            return cleaned
    return last_number(text)


def last_number(text: str) -> str | None:
    """The last number written in `text`, as written (for example "1,000" or "3/4")."""
    found = _NUMBER.findall(_FRAC.sub(r"\1/\2", text))
    return found[-1].strip() if found else None


def normalize_number(text: str) -> Number | None:
    """A number string as a value: "1,000" -> 1000, "3.0" -> 3, "$-2.50" -> -2.5, "+45" -> 45, "3/4" -> 0.75, "50%" -> 50.

    Integral values come back as `int`. Anything that is not a single number gives None.
    """
    s = _FRAC.sub(r"\1/\2", text.strip())
    s = re.sub(r"^[$€£\s]+|[%.\s]+$", "", s.replace("\\$", "$").replace("\\%", "%"))
    s = s.replace(" ", "")
    if not s:
        return None
    if "/" in s:
        num, _, den = s.partition("/")
        if "/" in den:  # before recursing: "1/1/1/..." must not recurse once per slash
            return None
        a, b = normalize_number(num), normalize_number(den)
        if a is None or b is None or b == 0:
            return None
        return _tidy(a / b)
    if not re.fullmatch(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?", s) or not re.search(r"\d", s):
        return None
    try:
        value = float(s.replace(",", ""))
    except ValueError:
        return None
    return _tidy(value)


def _tidy(value: float) -> Number:
    if value != value or value in (float("inf"), float("-inf")):  # NaN or infinite: keep as float
        return value
    return int(value) if float(value).is_integer() and abs(value) < 2**63 else value


def answer_number(text: str) -> Number | None:
    """The final answer of `text` as a number, or None.

    When the answer is an expression such as "12 + 7 = 19" the value after the last "=" wins;
    otherwise the first number in the answer ("42 apples" -> 42).
    """
    answer = extract_answer(text)
    if answer is None:
        return None
    value = normalize_number(answer)
    if value is not None:
        return value
    tail = answer.rsplit("=", 1)[-1]
    found = _NUMBER.findall(_FRAC.sub(r"\1/\2", tail))
    return normalize_number(found[0]) if found else None


def numbers_equal(a: Number | None, b: Number | None, *, tol: float = 1e-6) -> bool:
    """Equal within an absolute tolerance, or a relative one for large values."""
    if a is None or b is None:
        return False
    return abs(a - b) <= max(tol, tol * max(abs(a), abs(b)))
