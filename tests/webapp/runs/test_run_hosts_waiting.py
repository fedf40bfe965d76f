"""A run on several hosts while its Ray cluster has not granted its ranks: the run page and the
workers page say what it waits for instead of looking stuck, the run's cancel ends the wait (the
run ends cancelled with the reason), and once granted both pages show the hosts, the ranks and
the Ray nodes, and that the ranks are starting. The launcher's own logic runs for real (`training.ray_launch.admit` with the web's
sink); only Ray's placement group is faked (tests/training/test_ray_admission.py covers it)."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from training.ray_launch import Cluster, Node, admit, cancelled_waiting, placed, report_placed
from webapp.models import Run, Worker
from webapp.runs import services as run_services

ADDRESS = "head:6379"
CLUSTER = Cluster([Node(id="n-a", name="alpha", resources={"CPU": 1}), Node(id="n-b", name="bravo", resources={"CPU": 1})])


class Reservation:
    """A placement group Ray has not granted: each wait calls `during(n)`; granted from wait `grant_at`."""

    def __init__(self, during, grant_at: int | None = None):
        self.during, self.grant_at, self.waits, self.removed = during, grant_at, 0, False

    def wait(self, timeout_s: float) -> bool:
        self.waits += 1
        self.during(self.waits)
        return self.grant_at is not None and self.waits >= self.grant_at

    def nodes(self) -> list[str]:
        return ["n-a", "n-b"]

    def remove(self) -> None:
        self.removed = True


def _two_hosts(world, settings) -> Run:
    settings.TROUPE_RAY_ADDRESS = ADDRESS
    config = run_services.run_config_build(topology=world.topology, dataset=world.dataset,
                                           overrides={"resources.hosts": 2, "optim.tasks_per_step": 2})
    Run.objects.filter(pk=world.run.pk).update(config_yaml=config.to_yaml(), hosts=2)
    Worker.objects.create(hostname="ray0@head", last_seen=timezone.now(), queues="ray")
    return world.run


def _launcher(reservation, seen):
    """`training.ray_launch.launch` up to Ray Train's submission, with Ray's placement group faked."""

    def train(config, *, out_dir, sink):
        admission = admit(config, sink, CLUSTER, lambda: reservation, resource="CPU", address=ADDRESS, wait_s=600,
                          poll_s=0, say_every_s=0)
        if admission.cancelled:
            return cancelled_waiting(config, sink, admission, resource="CPU")
        report_placed(sink, placed(config, CLUSTER, admission, resource="CPU", address=ADDRESS))
        seen["granted"] = True
        return cancelled_waiting(config, sink, admission, resource="CPU")  # stands in for Ray Train's run

    return train


def test_cancel_reaches_a_run_waiting_for_its_ray_placement_group(alice, alice_world, settings):
    run = _two_hosts(alice_world, settings)
    pages: dict[str, str] = {}

    def during(n: int) -> None:
        if n == 2:  # the user looks, then cancels, while the run waits
            pages["run"] = " ".join(alice.client.get(run.get_absolute_url()).content.decode().split())
            pages["workers"] = " ".join(alice.client.get(reverse("worker_list")).content.decode().split())
            alice.client.post(reverse("run_cancel", args=[run.pk]))

    reservation, seen = Reservation(during), {}
    run_services.run_execute(worker="ray0@head", hosts=2, train=_launcher(reservation, seen))
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and "granted" not in seen and reservation.removed
    assert "cancelled while waiting" in run.error_message and "no rank started, and the reservation was removed" in run.error_message
    assert reservation.waits == 2, "the wait ends at the poll that follows the cancel"

    waiting = "Waiting for 2 hosts&#x27; CPUs on the Ray cluster (2 ranks x 1 CPU, all at once)"
    assert waiting in pages["run"] and waiting in pages["workers"]
    assert "2 hosts × 1 rank each: 2 ranks on the Ray cluster (data)" in pages["run"], "before the grant: not a GPU the cluster may not have"
    assert "not granted yet" in pages["run"]
    assert run.cluster == {} and "Ray node" not in alice.client.get(run.get_absolute_url()).content.decode()


def test_a_granted_run_shows_its_hosts_and_ray_nodes_on_both_pages(alice, alice_world, settings):
    run = _two_hosts(alice_world, settings)
    pages: dict[str, str] = {}
    seen: dict[str, bool] = {}

    def during(n: int) -> None:
        pass

    reservation = Reservation(during, grant_at=2)
    train = _launcher(reservation, seen)

    def train_and_look(config, *, out_dir, sink):
        result = train(config, out_dir=out_dir, sink=sink)
        pages["run"] = " ".join(alice.client.get(run.get_absolute_url()).content.decode().split())
        pages["workers"] = " ".join(alice.client.get(reverse("worker_list")).content.decode().split())
        return result

    run_services.run_execute(worker="ray0@head", hosts=2, train=train_and_look)
    run.refresh_from_db()
    assert seen["granted"] and reservation.removed
    assert run.cluster["nodes"] == {"alpha": 1, "bravo": 1} and run.cluster["resource"] == "CPU"
    for page in (pages["run"], pages["workers"]):
        assert "2 hosts × 1 CPU: 2 ranks on the Ray cluster (data)" in page
        assert "2 Ray nodes: 1 rank on alpha, 1 rank on bravo" in page
    assert "Hosts" in pages["run"] and "not granted yet" not in pages["run"]
    starting = "Starting 2 ranks on 2 Ray nodes (1 on alpha, 1 on bravo): Ray Train starts a process per rank and joins them over gloo"
    assert starting in pages["run"] and starting in pages["workers"], "no longer waiting: the ranks are starting"


@pytest.mark.parametrize(
    ("cluster", "line"),
    [
        ({}, "2 hosts × 4 ranks each: 8 ranks on the Ray cluster (fsdp)"),
        ({"resource": "GPU", "nodes": {"a": 4, "b": 4}}, "2 hosts × 4 GPUs: 8 ranks on the Ray cluster (fsdp)"),
        ({"resource": "CPU", "nodes": {"a": 4, "b": 4}}, "2 hosts × 4 CPUs: 8 ranks on the Ray cluster (fsdp)"),
    ],
)
def test_the_resources_line_names_gpus_or_cpus_only_once_the_cluster_granted_them(cluster, line):
    from types import SimpleNamespace

    from webapp.templatetags.troupe import resources

    run = SimpleNamespace(hosts=2, gpus=4, config_yaml="resources: {hosts: 2, gpus: 4, parallel: fsdp}\n", cluster=cluster)
    assert resources(run) == line
