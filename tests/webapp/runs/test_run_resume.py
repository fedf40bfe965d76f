"""Resume: a failed or cancelled run with a checkpoint starts a new run from it, linked to it, at
the checkpoint's step; the new run's charts continue the old curves."""

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


def test_it_records_the_step_it_resumes_from(alice, alice_world, enqueued):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="failed", error_message="worker lost: gpu0@a stopped")
    Checkpoint.objects.create(run=run, step=4, path="/tmp/ck/step-000004")
    alice.client.post(reverse("run_resume", args=[run.pk]))
    new = Run.objects.get(resumed_from=run)
    assert new.resumed_at_step == 4 and new.step == 4 and new.name.endswith("(resumed @4)")
    page = alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert f'Resumed as <a href="{new.get_absolute_url()}">#{new.pk}</a>' in page


def test_it_only_resumes_failed_or_cancelled_runs(alice, alice_world):
    run = alice_world.run
    Checkpoint.objects.create(run=run, step=2, path="/tmp/ck/step-000002")
    for status in ("queued", "running", "succeeded"):
        Run.objects.filter(pk=run.pk).update(status=status)
        response = alice.client.post(reverse("run_resume", args=[run.pk]), follow=True)
        assert b"Only a failed or cancelled run with a checkpoint can be resumed" in response.content, status
        page = alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()
        assert "Resume from step" not in page, status
    assert Run.objects.count() == 1
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    assert "Resume from step 2" in alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()


def test_the_charts_of_a_resumed_run_continue_the_old_curves(alice_world):
    """Grandparent steps 1-5 (resumed at 3), parent 4-8 (resumed at 6), child 7-9: the child's
    series are 1-3 from the grandparent, 4-6 from the parent and 7-9 of its own."""
    from django.utils import timezone

    from webapp.models import MetricPoint
    from webapp.runs import series

    def with_points(run, steps, value):
        MetricPoint.objects.bulk_create([MetricPoint(run=run, step=s, values={"reward/total": value}, time=timezone.now()) for s in steps])
        return run

    grand = with_points(alice_world.run, range(1, 6), 1.0)
    parent = with_points(Run.objects.create(team=grand.team, name="p", config_yaml=grand.config_yaml, resumed_from=grand,
                                            resumed_at_step=3), range(4, 9), 2.0)
    child = with_points(Run.objects.create(team=grand.team, name="c", config_yaml=grand.config_yaml, resumed_from=parent,
                                           resumed_at_step=6), range(7, 10), 3.0)
    steps, values = series.metrics_message(run_id=child.pk)["run"]["reward/total"]
    assert steps == list(range(1, 10))
    assert values == [1.0] * 3 + [2.0] * 3 + [3.0] * 3
    assert series.metrics_message(run_id=child.pk, since=6)["run"]["reward/total"][0] == [7, 8, 9]  # a reconnect after step 6
    assert series.metrics_message(run_id=grand.pk)["run"]["reward/total"][0] == [1, 2, 3, 4, 5]  # the old run is unchanged
