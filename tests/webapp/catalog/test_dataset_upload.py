"""Dataset upload: size, encoding, format and required fields are checked; a bad file leaves
nothing behind (no row, no stored file); a good one shows its first rows, row count and split."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.webapp.conftest import jsonl
from webapp.models import Dataset


def upload(persona, filename, content, **extra):
    data = {"name": "mine", "environment": "math_tool", "eval_fraction": "0.25",
            "file": SimpleUploadedFile(filename, content, content_type="application/octet-stream")}
    data.update(extra)
    return persona.client.post(reverse("dataset_upload"), data)


def assert_nothing_saved(alice, data_dir):
    assert not Dataset.objects.filter(team=alice.team).exists()
    stored = [p for p in (data_dir / "datasets").rglob("*") if p.is_file()] if (data_dir / "datasets").exists() else []
    assert stored == []


def file_error(response):
    assert response.status_code == 200
    return " ".join(response.context["form"].errors["file"])


def test_it_stores_a_good_jsonl_file_under_a_random_name(alice, good_rows, data_dir):
    response = upload(alice, "tasks.jsonl", jsonl(good_rows))
    dataset = Dataset.objects.get(team=alice.team, name="mine")
    assert response["Location"] == dataset.get_absolute_url()
    assert dataset.row_count == 6 and dataset.format == "jsonl" and dataset.status == "valid"
    assert dataset.split == (4, 2)  # 0.25 of 6 rounds to 2
    assert dataset.path.is_file() and dataset.path.is_relative_to(data_dir / "datasets")
    assert "tasks" not in dataset.path.name
    assert set(dataset.schema) >= {"question", "answer"} or dataset.schema
    page = alice.client.get(dataset.get_absolute_url()).content.decode()
    assert "4 train / 2 held out" in page
    assert str(good_rows[0][dataset.schema[0]])[:20] in page


def test_it_accepts_csv(alice, good_rows):
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(good_rows[0]))
    writer.writeheader()
    writer.writerows({k: v if isinstance(v, str) else json.dumps(v) for k, v in r.items()} for r in good_rows)
    upload(alice, "tasks.csv", buffer.getvalue().encode())
    dataset = Dataset.objects.get(team=alice.team, name="mine")
    assert dataset.format == "csv" and dataset.row_count == 6


def test_it_rejects_an_empty_file(alice, data_dir):
    assert "empty" in file_error(upload(alice, "tasks.jsonl", b""))
    assert_nothing_saved(alice, data_dir)


def test_it_rejects_a_binary_file(alice, data_dir):
    assert "binary" in file_error(upload(alice, "tasks.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"))
    assert_nothing_saved(alice, data_dir)


def test_it_rejects_text_that_is_not_utf8(alice, good_rows, data_dir):
    content = jsonl(good_rows[:2]) + '{"question": "caf\u00e9?", "answer": "1"}\n'.encode("latin-1")
    error = file_error(upload(alice, "tasks.jsonl", content))
    assert "UTF-8" in error and "line 3" in error
    assert_nothing_saved(alice, data_dir)


def test_it_names_the_broken_jsonl_line(alice, good_rows, data_dir):
    lines = jsonl(good_rows).decode().splitlines()
    lines[3] = '{"question": "2+2", "answer": '
    error = file_error(upload(alice, "tasks.jsonl", ("\n".join(lines) + "\n").encode()))
    assert "line 4" in error and "JSON" in error
    assert_nothing_saved(alice, data_dir)


def test_it_names_the_missing_csv_column(alice, math_tool, data_dir):
    required = list(math_tool.required_fields)
    header = [f for f in required[1:]] + ["notes"]
    content = (",".join(header) + "\n" + ",".join("x" for _ in header) + "\n").encode()
    error = file_error(upload(alice, "tasks.csv", content))
    assert required[0] in error
    assert_nothing_saved(alice, data_dir)


def test_it_rejects_too_many_rows(alice, good_rows, settings, data_dir):
    settings.TROUPE_UPLOAD_MAX_ROWS = 3
    assert "more than 3 rows" in file_error(upload(alice, "tasks.jsonl", jsonl(good_rows)))
    assert_nothing_saved(alice, data_dir)


def test_it_rejects_too_many_bytes(alice, good_rows, settings, data_dir):
    settings.TROUPE_UPLOAD_MAX_BYTES = 64
    assert "limit is 64" in file_error(upload(alice, "tasks.jsonl", jsonl(good_rows)))
    assert_nothing_saved(alice, data_dir)


def test_it_keeps_the_form_errors_inline_for_other_fields(alice, good_rows, data_dir):
    response = upload(alice, "tasks.jsonl", jsonl(good_rows), eval_fraction="0.95", name="")
    errors = response.context["form"].errors
    assert "eval_fraction" in errors and "name" in errors
    assert_nothing_saved(alice, data_dir)


def test_it_refuses_a_duplicate_name_without_storing_the_file(alice, alice_world, good_rows, data_dir):
    response = upload(alice, "tasks.jsonl", jsonl(good_rows), name=alice_world.dataset.name)
    assert "name" in response.context["form"].errors
    assert not (data_dir / "datasets").exists() or not any(p.is_file() for p in (data_dir / "datasets").rglob("*"))


@pytest.mark.parametrize("suffix", ["txt", "data"])
def test_it_detects_the_format_from_content_without_a_known_extension(alice, good_rows, suffix):
    upload(alice, f"tasks.{suffix}", jsonl(good_rows))
    assert Dataset.objects.get(team=alice.team).format == "jsonl"


def test_it_deletes_the_file_with_the_dataset(alice, good_rows, django_capture_on_commit_callbacks):
    upload(alice, "tasks.jsonl", jsonl(good_rows))
    dataset = Dataset.objects.get(team=alice.team)
    path = dataset.path
    with django_capture_on_commit_callbacks(execute=True):
        alice.client.post(reverse("dataset_delete", args=[dataset.pk]))
    assert not Dataset.objects.filter(pk=dataset.pk).exists()
    assert not path.exists()
