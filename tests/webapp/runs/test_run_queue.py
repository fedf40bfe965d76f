"""The queue: positions, dispatch in queue order whatever order Celery delivers messages in, and
team admins moving their own runs up and down without jumping other teams' runs."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.conftest import FakeResult
from webapp.models import Membership, Run
from webapp.runs import queue
from webapp.runs import services as run_services


def queued_copy(run: Run, name: str, **fields) -> Run:
    """Another queued run like `run` (same team and config), created now: at the back of the queue."""
    return Run.objects.create(team=run.team, name=name, topology=run.topology, dataset=run.dataset,
                              config_yaml=run.config_yaml, total_steps=run.total_steps, **fields)


def names(runs) -> list[str]:
    return [r.name for r in runs]


def executed(worker: str = "w") -> str | None:
    run = run_services.run_execute(worker=worker, train=lambda config, *, out_dir, sink: FakeResult(status="succeeded", step=3))
    return run.name if run else None


def test_it_gives_queued_runs_their_place_in_the_shared_queue(alice_world, bob_world):
    a1 = alice_world.run
    b1 = bob_world.run
    a2 = queued_copy(a1, "a2")
    assert [queue.run_queue_position(run=r) for r in (a1, b1, a2)] == [1, 2, 3]
    assert queue.run_queue_positions() == {a1.pk: 1, b1.pk: 2, a2.pk: 3}
    Run.objects.filter(pk=a1.pk).update(status=Run.Status.RUNNING)
    a1.refresh_from_db()
    assert queue.run_queue_position(run=a1) is None
    assert queue.run_queue_position(run=b1) == 1


def test_a_message_executes_the_first_queued_run_in_queue_order(alice_world):
    first = alice_world.run
    second = queued_copy(first, "second")
    urgent = queued_copy(first, "urgent", priority=5)
    assert names(queue.run_queue()) == ["urgent", "first", "second"]
    # Three messages, whatever run each was sent for: they start the runs in queue order.
    assert [executed(), executed(), executed()] == ["urgent", "first", "second"]
    assert executed() is None  # a spare message (e.g. a cancelled run's) finds nothing to do
    assert set(Run.objects.values_list("status", flat=True)) == {"succeeded"}
    assert urgent.pk != second.pk


def test_a_cancelled_runs_message_starts_the_next_run_instead(alice_world):
    queued_copy(alice_world.run, "other")
    run_services.run_cancel(run=alice_world.run)
    assert executed() == "other"
    assert executed() is None


def test_a_claimed_run_is_never_claimed_again(alice_world):
    assert queue.run_claim(run_id=alice_world.run.pk, worker="w1") is not None
    assert queue.run_claim(run_id=alice_world.run.pk, worker="w2") is None
    assert queue.run_claim_next(worker="w2") is None
    alice_world.run.refresh_from_db()
    assert alice_world.run.worker == "w1"


def test_team_admins_move_their_runs_without_jumping_other_teams(alice, alice_world, bob_world):
    a1, b1 = alice_world.run, bob_world.run
    a2 = queued_copy(a1, "a2")
    queued_copy(b1, "b2")
    assert names(queue.run_queue()) == ["first", "first", "a2", "b2"]
    response = alice.client.post(reverse("run_queue_move", args=[a2.pk, "up"]))
    assert response.status_code == 302 and response["Location"] == a2.get_absolute_url()
    order = list(queue.run_queue())
    assert [(r.team.name, r.name) for r in order] == [("Alpha", "a2"), ("Bravo", "first"), ("Alpha", "first"), ("Bravo", "b2")]
    alice.client.post(reverse("run_queue_move", args=[a2.pk, "down"]))
    assert [(r.team.name, r.name) for r in queue.run_queue()] == [
        ("Alpha", "first"), ("Bravo", "first"), ("Alpha", "a2"), ("Bravo", "b2"),
    ]
    # Moving the last one further down, or a run that is not queued, changes nothing.
    alice.client.post(reverse("run_queue_move", args=[a2.pk, "down"]))
    assert names(queue.run_queue()) == ["first", "first", "a2", "b2"]


def test_it_dispatches_in_the_order_admins_set(alice, alice_world):
    a2 = queued_copy(alice_world.run, "a2")
    alice.client.post(reverse("run_queue_move", args=[a2.pk, "up"]))
    assert executed() == "a2"


def test_it_moves_runs_whose_places_tie(alice, alice_world):
    a2 = queued_copy(alice_world.run, "a2")
    Run.objects.update(queue_order=1000, priority=0)  # e.g. rows that existed before the migration
    alice.client.post(reverse("run_queue_move", args=[a2.pk, "up"]))
    assert names(queue.run_queue()) == ["a2", "first"]


def test_members_cannot_reorder(alice, alice_world):
    Membership.objects.filter(user=alice.user).update(role=Membership.Role.MEMBER)
    a2 = queued_copy(alice_world.run, "a2")
    response = alice.client.post(reverse("run_queue_move", args=[a2.pk, "up"]))
    assert response.status_code == 403
    assert names(queue.run_queue()) == ["first", "a2"]


def test_site_staff_can_reorder_without_being_team_admins(alice, alice_world):
    Membership.objects.filter(user=alice.user).update(role=Membership.Role.MEMBER)
    alice.user.is_staff = True
    alice.user.save()
    a2 = queued_copy(alice_world.run, "a2")
    alice.client.post(reverse("run_queue_move", args=[a2.pk, "up"]))
    assert names(queue.run_queue()) == ["a2", "first"]


def test_moving_only_accepts_post_and_up_or_down(alice, alice_world):
    assert alice.client.get(reverse("run_queue_move", args=[alice_world.run.pk, "up"])).status_code == 405
    assert alice.client.post(f"/runs/{alice_world.run.pk}/queue/sideways/").status_code == 404


def test_it_shows_the_position_on_the_run_page_and_the_dashboard(alice, alice_world, bob_world):
    a2 = queued_copy(alice_world.run, "a2")
    page = alice.client.get(reverse("run_detail", args=[a2.pk])).content.decode()
    assert reverse("run_queue_position", args=[a2.pk]) in page  # the queue line loads (and refreshes) over htmx
    fragment = alice.client.get(reverse("run_queue_position", args=[a2.pk]), headers={"HX-Request": "true"}).content.decode()
    assert "number 3</strong> in the shared queue (2 ahead)" in fragment and "Move up" in fragment
    dashboard = alice.client.get(reverse("dashboard")).content.decode()
    assert "#1" in dashboard and "#3" in dashboard and f"Move #{a2.pk} up" in dashboard
    assert "Bravo" not in dashboard  # a position, never another team's run


def test_the_queue_line_is_empty_once_the_run_started(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.RUNNING)
    fragment = alice.client.get(reverse("run_queue_position", args=[alice_world.run.pk])).content.decode()
    assert "Queued" not in fragment and "hx-get" not in fragment  # stops polling


def test_runs_needing_several_gpus_wait_for_a_worker_with_that_many(alice_world, monkeypatch, django_capture_on_commit_callbacks):
    from webapp.core import enqueue

    sent = []
    monkeypatch.setattr(enqueue.current_app, "send_task", lambda name, args, **kw: sent.append((args[0], kw["queue"])))
    config = alice_world.run.to_config().replace(**{"resources.gpus": 2, "optim.tasks_per_step": 2})
    with django_capture_on_commit_callbacks(execute=True):
        big = run_services.run_create(team=alice_world.run.team, user=None, name="big", config=config,
                                  topology=alice_world.topology, dataset=alice_world.dataset)
    Run.objects.filter(pk=big.pk).update(priority=5)  # first in the queue
    assert big.gpus == 2 and sent == [(big.pk, "gpu-x2")]
    # a one-GPU message passes over the two-GPU run at the head of the queue ...
    assert executed("one-gpu") == alice_world.run.name
    assert Run.objects.get(pk=big.pk).status == "queued"
    # ... which the message from its own queue starts
    ran = run_services.run_execute(worker="two-gpus", gpus=2, train=lambda config, *, out_dir, sink: FakeResult(status="succeeded", step=3))
    assert ran.pk == big.pk and ran.worker == "two-gpus"


def test_the_celery_message_takes_a_run_of_its_own_gpu_count(alice_world, monkeypatch):
    from webapp.runs import tasks

    Run.objects.filter(pk=alice_world.run.pk).update(gpus=4)
    seen = {}
    monkeypatch.setattr(run_services, "run_execute", lambda **kw: seen.update(kw))
    tasks.run_execute.apply(args=[alice_world.run.pk])
    assert seen["gpus"] == 4
