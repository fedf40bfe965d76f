"""Cancel: a queued run is cancelled at once; a running run is asked to stop."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Run


def test_it_cancels_a_queued_run_at_once(alice, alice_world):
    response = alice.client.post(reverse("run_cancel", args=[alice_world.run.pk]))
    assert response.status_code == 302
    alice_world.run.refresh_from_db()
    assert alice_world.run.status == "cancelled" and alice_world.run.finished is not None


def test_it_asks_a_running_run_to_stop(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.RUNNING)
    alice.client.post(reverse("run_cancel", args=[alice_world.run.pk]))
    alice_world.run.refresh_from_db()
    assert alice_world.run.status == "running" and alice_world.run.cancel_requested
    assert b"stopping" in alice.client.get(reverse("run_detail", args=[alice_world.run.pk])).content


def test_it_leaves_finished_runs_alone(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.SUCCEEDED)
    alice.client.post(reverse("run_cancel", args=[alice_world.run.pk]))
    alice_world.run.refresh_from_db()
    assert alice_world.run.status == "succeeded" and not alice_world.run.cancel_requested


def test_it_only_accepts_post(alice, alice_world):
    assert alice.client.get(reverse("run_cancel", args=[alice_world.run.pk])).status_code == 405
