"""A dataset upload with several bad lines reports every one of them at once (up to a cap), each
with its line, next to the file field; nothing is stored. The engine's reader does the same."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from training.data import MAX_PROBLEMS, DataError, DataErrors, read_rows
from webapp.models import Dataset

GOOD = {"question": "Compute 1 + 1.", "answer": "2"}


def post(persona, filename: str, content: bytes):
    return persona.client.post(reverse("dataset_upload"), {
        "name": "mine", "environment": "math_tool", "eval_fraction": "0.25",
        "file": SimpleUploadedFile(filename, content, content_type="application/octet-stream")})


def test_it_lists_every_bad_line_of_a_jsonl_upload(alice, data_dir):
    lines = [json.dumps(GOOD), "{not json", json.dumps({"question": "Compute 2 + 2."}), json.dumps(GOOD), "[1, 2]",
             json.dumps({"answer": "3"}), json.dumps({**GOOD, "question": ["a", "list"]}), json.dumps(GOOD)]
    response = post(alice, "five-bad.jsonl", "\n".join(lines).encode())
    errors = list(response.context["form"].errors["file"])
    assert [e.split(":")[0] for e in errors[:5]] == ["line 2", "line 3", "line 5", "line 6", "line 7"], errors
    assert "invalid JSON" in errors[0] and "missing required field(s) answer" in errors[1] and "JSON object" in errors[2]
    assert errors[-1] == "math_tool rows need: question, answer."  # said once, after the lines that lack a field
    page = response.content.decode()
    assert all(f"line {n}:" in page for n in (2, 3, 5, 6, 7))
    assert not Dataset.objects.exists() and not [p for p in (data_dir / "datasets").rglob("*") if p.is_file()]


def test_it_lists_every_csv_row_with_the_wrong_cells(alice):
    content = "question,answer\nCompute 1 + 1.,2\nCompute 2 + 2.\nCompute 3 + 3.,6,extra\n,4\nCompute 5 + 5.,10\n"
    errors = list(post(alice, "bad.csv", content.encode()).context["form"].errors["file"])
    assert [e.split(":")[0] for e in errors if e.startswith("line")] == ["line 3", "line 4", "line 5"], errors


def test_it_stops_at_a_cap_and_says_so(tmp_path, alice):
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(["{oops"] * (MAX_PROBLEMS + 30)))
    with pytest.raises(DataErrors) as caught:
        read_rows(path, required_fields=["question"])
    assert len(caught.value.problems) == MAX_PROBLEMS and caught.value.stopped
    assert [p.line for p in caught.value.problems] == list(range(1, MAX_PROBLEMS + 1))
    errors = list(post(alice, "many.jsonl", path.read_bytes()).context["form"].errors["file"])
    assert len(errors) == MAX_PROBLEMS + 1 and errors[-1].startswith(f"Stopped looking after {MAX_PROBLEMS} problems")


def test_one_bad_line_is_one_plain_error(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({"question": "x"}) + "\n")
    with pytest.raises(DataError) as caught:
        read_rows(path, required_fields=["question", "answer"])
    assert type(caught.value) is DataError and str(caught.value) == "line 2: missing required field(s) answer"


def test_a_file_level_problem_is_still_one_error(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(GOOD) for _ in range(5)) + "\n{bad\n")
    with pytest.raises(DataError, match="more than 3 rows"):
        read_rows(path, required_fields=["question"], max_rows=3)
