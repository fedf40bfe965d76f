"""Hypothesis strategies for dataset files, good and bad: what a team might upload by mistake
or on purpose. Used by the property tests of `read_rows` and of the web upload."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from hypothesis import strategies as st

HEADER_NAMES = ["question", "answer", "level", "notes", "prompt", "reference", "hidden_tests", "mutants", "grid", ""]
SUFFIXES = ["tasks.jsonl", "tasks.csv", "tasks.json", "tasks.txt", "tasks"]
ENCODINGS = ["utf-8", "utf-8-sig", "latin-1", "cp1252", "utf-16", "utf-16-le", "utf-32"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
"""Any JSON value: a field of the wrong kind, or metadata nested too deep."""


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _csv(header: list[str], rows: list[list[str]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


good_rows = st.lists(
    st.fixed_dictionaries({"question": st.text(min_size=1, max_size=30), "answer": st.integers(-999, 999).map(str)}),
    min_size=1, max_size=5,
)


@st.composite
def wrong_types(draw: st.DrawFn) -> tuple[str, bytes]:
    """Good rows, one field of which holds any JSON value (often an object or a list)."""
    rows = draw(good_rows)
    row = draw(st.sampled_from(rows))
    row[draw(st.sampled_from(["question", "answer", "level", "mutants", "grid", "meta"]))] = draw(json_values)
    return "tasks.jsonl", _jsonl(rows).encode("utf-8", "surrogatepass")


@st.composite
def deep_nesting(draw: st.DrawFn) -> tuple[str, bytes]:
    depth = draw(st.integers(1, 3_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    field = draw(st.sampled_from(["answer", "meta", "question"]))
    line = f'{{"question": "q", "answer": "1", "{field}": {opener * depth}1{closer * depth}}}\n'
    return draw(st.sampled_from(["tasks.jsonl", "tasks.txt"])), line.encode()


@st.composite
def csv_headers(draw: st.DrawFn) -> tuple[str, bytes]:
    """CSV files whose header may repeat, miss or blank a column, and rows of any width."""
    header = draw(st.lists(st.sampled_from(HEADER_NAMES), min_size=1, max_size=6))
    rows = draw(st.lists(st.lists(st.text(max_size=12), min_size=0, max_size=7), max_size=4))
    return "tasks.csv", _csv(header, rows).encode("utf-8", "surrogatepass")


@st.composite
def huge_fields(draw: st.DrawFn) -> tuple[str, bytes]:
    size = draw(st.sampled_from([19_999, 20_000, 20_001, 131_073, 200_000]))
    blob = draw(st.sampled_from(["x", "é", ".", "[", "\\n"])) * size
    if draw(st.booleans()):
        return "tasks.csv", _csv(["question", "answer"], [["q", "1"], [blob, "2"]]).encode()
    field = draw(st.sampled_from(["question", "answer", "meta", "x" * 150]))
    return "tasks.jsonl", _jsonl([{"question": "q", "answer": "1", field: blob}]).encode()


@st.composite
def other_encodings(draw: st.DrawFn) -> tuple[str, bytes]:
    rows = [{"question": "Combien font 1+1 à la café? ½ — ", "answer": "2"}]
    text = draw(st.sampled_from([_jsonl(rows), _csv(["question", "answer"], [["café ½", "2"]])]))
    encoded = text.encode(draw(st.sampled_from(ENCODINGS)), "replace")
    if draw(st.booleans()):  # half one encoding, half another
        encoded = encoded + text.encode(draw(st.sampled_from(ENCODINGS)), "replace")
    return draw(st.sampled_from(SUFFIXES)), encoded


@st.composite
def damaged(draw: st.DrawFn) -> tuple[str, bytes]:
    """A good file with bytes inserted: NUL, CR, quotes, brackets, escapes, invalid UTF-8."""
    rows = draw(good_rows)
    text = draw(st.sampled_from([_jsonl(rows), _csv(["question", "answer"], [[r["question"], r["answer"]] for r in rows])]))
    content = bytearray(text.encode("utf-8"))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(content)))
        junk = draw(st.sampled_from([b"\x00", b"\r", b'"', b"[", b"{", b"\\ud800", b"\\u0000", b"\xff", b"\xc3", b",", b"\n",
                                     b"NaN", b"1e999", b"\xef\xbb\xbf"]))
        content[at:at] = junk
    return draw(st.sampled_from(SUFFIXES)), bytes(content)


def bad_files() -> st.SearchStrategy[tuple[str, bytes]]:
    """(filename, content) of every kind above, plus random bytes."""
    return st.one_of(
        st.tuples(st.sampled_from(SUFFIXES), st.binary(max_size=400)),
        wrong_types(), deep_nesting(), csv_headers(), huge_fields(), other_encodings(), damaged(),
    )
