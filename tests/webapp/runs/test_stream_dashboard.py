"""The dashboard's runs part refreshes itself over htmx: progress, status, what a running run is
doing and its ETA (the engine's estimate)."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from webapp.models import Run


def test_it_polls_its_runs_part_and_serves_it_alone(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="running", step=3, total_steps=10,
                                                     started=timezone.now() - timedelta(seconds=30),
                                                     phase="evaluating", phase_detail="Evaluating at step 3: 25/100 held-out tasks",
                                                     eta=timezone.now() + timedelta(seconds=70.5))
    page = alice.client.get(reverse("dashboard")).content.decode()
    assert 'id="dashboard-runs"' in page and "every 3s" in page
    partial = alice.client.get(reverse("dashboard"), headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="dashboard-runs"') and "<html" not in partial
    assert "3/10" in partial and "Running" in partial
    assert "ETA 1m 10s · evaluating" in partial or "ETA 1m 0" in partial  # the engine expects it to end in 70 s
    assert "Evaluating at step 3: 25/100 held-out tasks" in partial
    Run.objects.filter(pk=alice_world.run.pk).update(phase="loading", phase_detail="Loading the models", eta=None)
    partial = alice.client.get(reverse("dashboard"), headers={"HX-Request": "true"}).content.decode()
    assert "ETA after the first step · loading" in partial  # not blank while it loads (issue 46, class 3)
    assert "Loading the models" in partial and "Evaluating at step 3" not in partial


def test_it_polls_slowly_when_nothing_runs(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    assert "every 15s" in alice.client.get(reverse("dashboard")).content.decode()


def test_it_shows_only_the_teams_runs(alice, alice_world, bob, bob_world):
    partial = bob.client.get(reverse("dashboard"), headers={"HX-Request": "true"}).content.decode()
    assert f"#{alice_world.run.pk} " not in partial and f"#{bob_world.run.pk} " in partial
