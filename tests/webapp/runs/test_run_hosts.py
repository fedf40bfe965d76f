"""A run on several hosts (`resources.hosts > 1`): refused where the operator named no Ray cluster
(at the form and again on the worker), queued on the `ray` queue where one is named, and claimed
only by a message from that queue. The engine's side is tests/training/test_ray_launch.py; a real
two-node cluster is driven by tests/webapp/runs/test_integration_ray.py."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.conftest import FakeResult
from tests.webapp.runs.test_run_form import _data
from webapp.models import Run
from webapp.runs import services as run_services

TWO_HOSTS = "resources: {hosts: 2}"


def test_it_refuses_a_run_on_several_hosts_without_a_ray_cluster(alice, alice_world, enqueued, settings):
    settings.TROUPE_RAY_ADDRESS = ""
    response = alice.client.post(reverse("run_new"), _data(alice_world, tasks_per_step="2", hosts="2"))
    assert response.status_code == 200
    [error] = response.context["form"].errors["hosts"]
    assert "The run asks for 2 hosts, and this installation names no Ray cluster" in error and "TROUPE_RAY_ADDRESS" in error
    assert Run.objects.count() == 1 and enqueued == []


def test_it_queues_a_run_on_several_hosts_on_the_ray_queue(alice, alice_world, settings, monkeypatch, django_capture_on_commit_callbacks):
    settings.TROUPE_RAY_ADDRESS = "head:6379"
    sent: list[tuple[int, str]] = []
    from webapp.core import enqueue

    monkeypatch.setattr(enqueue.current_app, "send_task", lambda name, args, **kw: sent.append((args[0], kw.get("queue"))))
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_new"), _data(alice_world, tasks_per_step="2", advanced_yaml=TWO_HOSTS))
    assert response.status_code == 302, response.context["form"].errors
    run = Run.objects.exclude(pk=alice_world.run.pk).get()
    assert run.hosts == 2 and run.to_config().resources.hosts == 2
    assert run.queue_name == "ray" and sent == [(run.pk, "ray")]


def _done(config, *, out_dir, sink):
    return FakeResult(status="succeeded", step=2)


def test_only_a_message_of_the_ray_queue_claims_a_run_on_several_hosts(alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(hosts=2)
    one_gpu = Run.objects.create(team=alice_world.run.team, name="one gpu", config_yaml=alice_world.run.config_yaml, total_steps=2)
    assert run_services.run_execute(worker="w", gpus=1, train=_done).pk == one_gpu.pk
    assert run_services.run_execute(worker="w", gpus=1, train=_done) is None  # a `gpu` message leaves the Ray run queued
    assert run_services.run_execute(worker="w", hosts=2, train=_done).pk == alice_world.run.pk


def test_a_worker_without_the_cluster_fails_the_run_with_the_reason(alice_world, data_dir, settings):
    settings.TROUPE_RAY_ADDRESS = "head:6379"
    config = run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset,
                                           overrides={"resources.hosts": 2, "optim.tasks_per_step": 2})
    Run.objects.filter(pk=alice_world.run.pk).update(config_yaml=config.to_yaml(), hosts=2)
    settings.TROUPE_RAY_ADDRESS = ""  # the worker's own environment names no cluster
    trained: list[object] = []
    run = run_services.run_execute(worker="w", hosts=2, train=lambda config, **kw: trained.append(config))
    assert run.status == Run.Status.FAILED and trained == []
    assert "resources.hosts" in run.error_message and "TROUPE_RAY_ADDRESS" in run.error_message
