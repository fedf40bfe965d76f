"""What the run page does, the API does (issue 46, class 4), through the same services: tags,
notes and archive (PATCH /api/v1/runs/<id>/), resume (POST .../resume/). And a run launch sent as
text/plain is a 415, not read as YAML: the content type says nothing of YAML."""

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


def test_a_run_s_tags_notes_and_archive_change_as_on_its_page(alice, alice_world, api):  # noqa: F811
    run = alice_world.run
    url = reverse("api_run", args=[run.pk])
    response = api.send("PATCH", url, {"tags": ["baseline", "v2"], "notes": "the good one"})
    assert response.status_code == 200 and response.json()["tags"] == ["baseline", "v2"] and response.json()["notes"] == "the good one"
    response = api.send("PATCH", url, {"archived": True})  # still queued: the page refuses it too
    assert response.status_code == 400 and "stop it first" in response.json()["error"]
    response = api.send("PATCH", url, {"tags": "bad tag!", "notes": 3, "colour": "red"})
    assert response.status_code == 400 and set(response.json()["fields"]) == {"notes", "colour"}, response.json()  # types first
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    response = api.send("PATCH", url, {"archived": True, "tags": "bad tag!"})
    assert response.status_code == 400 and response.json()["field"] == "tags"
    run.refresh_from_db()
    assert not run.archived and sorted(t.name for t in run.tags.all()) == ["baseline", "v2"]  # nothing half-saved
    assert api.send("PATCH", url, {"archived": True}).json()["archived"] is True


def test_a_cancelled_run_resumes_from_its_checkpoint(alice, alice_world, api, enqueued, django_capture_on_commit_callbacks):  # noqa: F811
    from webapp.models import Checkpoint

    run = alice_world.run
    assert api.send("POST", reverse("api_run_resume", args=[run.pk])).status_code == 400  # queued: nothing to resume
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    Checkpoint.objects.create(run=run, step=2, path="/tmp/ck/step-000002")
    with django_capture_on_commit_callbacks(execute=True):
        response = api.send("POST", reverse("api_run_resume", args=[run.pk]))
    assert response.status_code == 201, response.content
    new = Run.objects.get(resumed_from=run)
    assert response.json()["id"] == new.pk and response.json()["resumed_from"] == run.pk and enqueued == [new.pk]
    assert response["Location"].endswith(reverse("api_run", args=[new.pk]))
