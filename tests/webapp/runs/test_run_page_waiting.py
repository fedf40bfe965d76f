"""A queued run's log box says what the run waits for (its place in the shared queue, the workers
that serve its queue and whether they are busy, or that none is online and how to start one),
and keeps saying it as that changes; no empty grey box."""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from tests.webapp.history_helpers import make_run
from webapp.models import Run, Worker


def log_box(html: str) -> str:
    return " ".join(html.split('id="log-card"')[1].split("</section>")[0].split())


def test_a_queued_runs_log_box_says_what_it_waits_for(alice, alice_world):
    run = alice_world.run
    box = log_box(alice.client.get(run.get_absolute_url()).content.decode())
    assert "Waiting for a worker: none is online for the gpu queue (it is next in the queue)" in box
    assert "python manage.py troupe" in box and "Nothing logged yet" not in box
    assert f'hx-get="{reverse("run_queue_position", args=[run.pk])}?part=waiting" hx-trigger="every 5s"' in box

    busy = Worker.objects.create(hostname="gpu0@a", last_seen=timezone.now(), queues="gpu,gpu-x2", run=make_run(
        alice.team, run, name="busy one", status=Run.Status.RUNNING))
    later = make_run(alice.team, run, name="later", status=Run.Status.QUEUED)
    url = reverse("run_queue_position", args=[later.pk])
    waiting = alice.client.get(url, {"part": "waiting"}, headers={"HX-Request": "true"}).content.decode()
    assert waiting.lstrip().startswith('<p class="empty" id="log-empty"')
    assert "Waiting for a worker to finish its run: 1 worker online for the gpu queue, 1 busy; 1 queued run ahead of it." in waiting

    Worker.objects.filter(pk=busy.pk).update(run=None)
    waiting = alice.client.get(url, {"part": "waiting"}).content.decode()
    assert "Waiting for a worker to take it: 1 worker online for the gpu queue, 0 busy" in waiting


def test_a_run_that_left_the_queue_stops_asking(alice, alice_world):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, worker="gpu0@a")
    waiting = alice.client.get(reverse("run_queue_position", args=[run.pk]), {"part": "waiting"}).content.decode()
    assert "hx-get" not in waiting and "Starting on gpu0@a: nothing logged yet." in waiting
