"""A run launch sent as text/plain is a 415, not read as YAML (issue 46, class 4): the content
type says nothing of YAML, and a script that forgot its header should hear so."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG
from tests.webapp.api.test_catalog_api import api  # noqa: F401 (the fixture)
from webapp.models import Run


def test_a_run_launch_as_text_plain_is_a_415(alice, api, enqueued):  # noqa: F811
    response = api.send("POST", reverse("api_runs"), TINY_CONFIG, content_type="text/plain")
    assert response.status_code == 415 and "application/yaml" in response.json()["error"], response.content
    assert not Run.objects.exists() and enqueued == []
    assert api.send("POST", reverse("api_runs"), TINY_CONFIG, content_type="application/yaml").status_code == 201
