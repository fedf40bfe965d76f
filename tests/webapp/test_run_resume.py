"""Resume: a finished run with a checkpoint starts a new run from it."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Checkpoint, Run


def test_it_resumes_from_the_latest_checkpoint(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    Checkpoint.objects.create(run=run, step=1, path="/tmp/ck/step-000001")
    Checkpoint.objects.create(run=run, step=2, path="/tmp/ck/step-000002")
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_resume", args=[run.pk]))
    new = Run.objects.get(resumed_from=run)
    assert response["Location"] == new.get_absolute_url()
    assert new.to_config().checkpoint.resume_from == "/tmp/ck/step-000002"
    assert new.status == "queued" and new.owner == alice.user and enqueued == [new.pk]


def test_it_refuses_to_resume_without_a_checkpoint(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="failed")
    response = alice.client.post(reverse("run_resume", args=[alice_world.run.pk]), follow=True)
    assert b"Only a failed or cancelled run with a checkpoint can be resumed" in response.content
    assert Run.objects.count() == 1
