"""Every bad dataset file in the corpus is refused with an error next to the file field that says
what is wrong (and where), and nothing is half-saved: no dataset row, no stored file."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.webapp.bad_inputs import FILES, FORMULA_CSV, BadFile
from webapp.models import Dataset


def upload(persona, filename: str, content: bytes):
    return persona.client.post(reverse("dataset_upload"), {
        "name": "mine", "environment": "math_tool", "eval_fraction": "0.25",
        "file": SimpleUploadedFile(filename, content, content_type="application/octet-stream"),
    })


def stored_files(data_dir) -> list:
    folder = data_dir / "datasets"
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


@pytest.mark.parametrize("bad", FILES, ids=[f.id for f in FILES])
def test_it_refuses_the_file_next_to_the_field_and_saves_nothing(alice, data_dir, settings, bad: BadFile):
    for name, value in bad.settings.items():
        setattr(settings, name, value)
    response = upload(alice, bad.filename, bad.content)
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == ["file"], errors
    message = " ".join(errors["file"])
    for phrase in bad.says:
        assert phrase in message, message
    html = response.content.decode()
    field = html[html.index('id="field-file"'):]
    assert bad.says[0] in field[: field.index("</div>")].replace("&#x27;", "'")  # shown at the field
    assert not Dataset.objects.exists()
    assert stored_files(data_dir) == []


def test_it_flags_cells_a_spreadsheet_would_run_as_formulas(alice, data_dir):
    response = upload(alice, "tasks.csv", FORMULA_CSV)
    dataset = Dataset.objects.get(team=alice.team)
    assert response["Location"] == dataset.get_absolute_url()
    assert dataset.status == Dataset.Status.VALID and dataset.row_count == 4  # training reads them as text
    assert dataset.status_message.startswith("Note: 3 cells start with =, +, -, @ or a tab (first: row 1, field question)")
    page = alice.client.get(dataset.get_absolute_url()).content.decode()
    assert "a spreadsheet would run such a cell as a formula" in page


def test_it_does_not_flag_plain_signed_numbers(alice, data_dir):
    upload(alice, "tasks.csv", b"question,answer\nWhat is 2 - 5?,-3\nWhat is +4?,+4.5e1\n")
    assert Dataset.objects.get(team=alice.team).status_message == ""


def test_the_flag_survives_revalidation(alice, data_dir):
    upload(alice, "tasks.csv", FORMULA_CSV)
    dataset = Dataset.objects.get(team=alice.team)
    alice.client.post(reverse("dataset_revalidate", args=[dataset.pk]))
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.VALID and dataset.status_message.startswith("Note: 3 cells")


def test_uploads_live_outside_static_files_under_random_names(alice, data_dir, settings):
    from tests.webapp.bad_inputs import GOOD_JSONL

    upload(alice, "../../static/evil.jsonl", GOOD_JSONL)
    dataset = Dataset.objects.get(team=alice.team)
    path = dataset.path.resolve()
    assert path.is_relative_to((data_dir / "datasets").resolve())
    for static in [settings.STATIC_ROOT, *settings.STATICFILES_DIRS]:
        assert not path.is_relative_to(static)
    assert "evil" not in path.name and len(path.stem) == 32  # a random token, the user's name kept only as a label
    assert dataset.original_filename.endswith("evil.jsonl")
    assert alice.client.get(f"/static/{path.name}").status_code == 404
