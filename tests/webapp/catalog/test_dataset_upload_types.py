"""Typed rows through the upload form: a row whose fields are of the wrong kind, a repeated CSV
header, deep nesting or a parser's error is refused next to the file field, naming the line and
the field; nothing is left behind (no dataset row, no stored or .part file). An oversize file is
refused on its size, before a byte of it is read. The page shows each environment's fields."""

from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile, TemporaryUploadedFile
from django.urls import reverse

from webapp.catalog import services as catalog
from webapp.models import Dataset

GOOD = b'{"question": "1+1?", "answer": "2"}\n'


def upload(persona, filename: str, content: bytes, environment: str = "math_tool"):
    return persona.client.post(reverse("dataset_upload"), {
        "name": "mine", "environment": environment, "eval_fraction": "0.25",
        "file": SimpleUploadedFile(filename, content, content_type="application/octet-stream"),
    })


def file_error(response) -> str:
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == ["file"], errors
    return " ".join(errors["file"])


def assert_nothing_left(data_dir) -> None:
    assert not Dataset.objects.exists()
    folder = data_dir / "datasets"
    assert not folder.exists() or [p for p in folder.rglob("*") if p.is_file()] == []  # rglob sees .part files too


def test_it_refuses_an_answer_that_is_an_object_or_a_list(alice, data_dir):
    for value, got in ((b'{"x": 1}', "an object"), (b"[2]", "a list")):
        error = file_error(upload(alice, "tasks.jsonl", GOOD + b'{"question": "2+2?", "answer": ' + value + b"}\n"))
        assert error == f"line 2: field 'answer' must be a number or text, got {got}"
        assert_nothing_left(data_dir)


def test_it_refuses_a_csv_whose_header_repeats_a_column(alice, data_dir):
    error = file_error(upload(alice, "tasks.csv", b"question,answer,answer\n1+1?,2,3\n"))
    assert error == "line 1: the CSV header repeats column 'answer'; column names must be unique"
    assert_nothing_left(data_dir)


def test_it_answers_deep_nesting_with_a_form_error_not_a_500(alice, data_dir):
    deep = b'{"question": "q", "answer": "1", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    assert file_error(upload(alice, "tasks.jsonl", GOOD + deep)) == "line 2: nested deeper than 20 levels"
    assert_nothing_left(data_dir)


def test_it_refuses_nul_bytes_past_the_first_8_kb(alice, data_dir):
    error = file_error(upload(alice, "tasks.jsonl", GOOD * 1_000 + b'{"question": "a\x00", "answer": "1"}\n'))
    assert error.startswith("line 1001: file looks binary (contains NUL bytes)")
    assert_nothing_left(data_dir)


def test_it_refuses_text_the_database_could_not_store(alice, data_dir):
    for escape, says in ((b"\\ud83d", "lone surrogate"), (b"\\u0000", "NUL character")):
        error = file_error(upload(alice, "tasks.jsonl", b'{"question": "x' + escape + b'", "answer": "1"}\n'))
        assert error.startswith("line 1: field 'question' contains a") and says in error
        assert_nothing_left(data_dir)


def test_it_names_the_field_and_the_limit(alice, data_dir):
    row = b'{"question": "' + b"x" * 20_001 + b'", "answer": "1"}\n'
    assert file_error(upload(alice, "tasks.jsonl", row)) == "line 1: field 'question' is 20,001 characters; the limit is 20,000"
    assert_nothing_left(data_dir)


def test_it_stores_csv_cells_converted_to_their_kinds(alice, data_dir):
    content = b'prompt,reference,hidden_tests,mutants\nWrite f,def f(): return 1,assert f() == 1,"[""def f(): return 2""]"\n'
    response = upload(alice, "tasks.csv", content, environment="code_tests")
    dataset = Dataset.objects.get(team=alice.team)
    assert response["Location"] == dataset.get_absolute_url()
    assert dataset.preview[0]["mutants"] == '["def f(): return 2"]'  # a list, shown as JSON


def test_it_refuses_an_oversize_file_on_its_size_before_reading_it(alice, data_dir, settings, monkeypatch):
    settings.TROUPE_UPLOAD_MAX_BYTES = 10_000
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1_000  # Django spools anything bigger to a temporary file, not memory
    seen, read = [], []
    service = catalog.dataset_upload
    monkeypatch.setattr(catalog, "dataset_upload", lambda **kw: seen.append(type(kw["upload"])) or service(**kw))
    monkeypatch.setattr(TemporaryUploadedFile, "chunks", lambda self, *a, **k: read.append("chunks") or iter(()))
    monkeypatch.setattr(TemporaryUploadedFile, "read", lambda self, *a, **k: read.append("read") or b"")
    error = file_error(upload(alice, "tasks.jsonl", GOOD * 1_000))
    assert error == f"The file is {len(GOOD) * 1_000:,} bytes; the limit is 10,000."
    assert seen == [TemporaryUploadedFile] and read == []
    assert_nothing_left(data_dir)


def test_revalidation_marks_a_stored_file_that_no_longer_checks_out(alice, data_dir):
    upload(alice, "tasks.jsonl", GOOD)
    dataset = Dataset.objects.get(team=alice.team)
    dataset.path.write_bytes(GOOD + b'{"question": "q", "answer": {"a": 1}}\n')
    alice.client.post(reverse("dataset_revalidate", args=[dataset.pk]))
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.INVALID
    assert dataset.status_message == "line 2: field 'answer' must be a number or text, got an object"


def test_the_upload_page_shows_each_fields_type_and_the_limits(alice):
    html = alice.client.get(reverse("dataset_upload")).content.decode()
    assert "<code>answer</code> (a number or text)" in html
    assert "<code>level</code> (a whole number, optional)" in html
    assert "<code>mutants</code> (a list of text)" in html  # every environment, in the details
    assert "<code>grid</code> (text, at most 2000 characters)" in html
    assert "20,000 characters per text field" in html and "64 fields per row" in html and "must be unique" in html
