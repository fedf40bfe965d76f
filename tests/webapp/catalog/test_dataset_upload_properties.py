"""Property-based: generated bad files (random bytes, deep nesting, wrong types, repeated headers,
huge fields, mixed encodings, NUL bytes, CRs) uploaded through the form by a logged-in member.
Whatever the file: no 5xx and no exception escapes the view (the test client re-raises one);
a refused file is a form error and leaves no Dataset row and no file (stored or .part); an
accepted one is stored whole. Derandomized, so it never flakes."""

from __future__ import annotations

import itertools

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.training.bad_files import bad_files
from webapp.models import Dataset

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ENVIRONMENTS = ["math_tool", "code_tests", "plan_path", "tests.agents.example_plugin:EchoEnv"]


def stored(data_dir) -> set:
    folder = data_dir / "datasets"
    return {p for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


@PROPERTY
@given(file=bad_files(), environment=st.sampled_from(ENVIRONMENTS))
def test_any_upload_is_a_dataset_or_a_form_error_and_nothing_half_saved(alice, data_dir, file, environment):
    filename, content = file
    before_rows, before_files = Dataset.objects.count(), stored(data_dir)
    name = f"upload {next(COUNTER)}"
    response = alice.client.post(reverse("dataset_upload"), {
        "name": name, "environment": environment, "eval_fraction": "0.1",
        "file": SimpleUploadedFile(filename, content, content_type="application/octet-stream"),
    })
    assert response.status_code in (200, 302), response.status_code
    if response.status_code == 302:
        dataset = Dataset.objects.get(team=alice.team, name=name)
        assert dataset.status == Dataset.Status.VALID and dataset.row_count >= 1
        assert dataset.path.read_bytes() == content
        assert stored(data_dir) == before_files | {dataset.path}
        return
    errors = response.context["form"].errors
    assert errors and "file" in errors or "environment" in errors, errors
    assert Dataset.objects.count() == before_rows
    assert stored(data_dir) == before_files


COUNTER = itertools.count()
