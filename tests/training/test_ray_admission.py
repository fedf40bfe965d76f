"""Before a run on several hosts is submitted to Ray Train (`training.ray_launch.admit`): a run
the cluster can never hold is refused at once with what the cluster has; one it can hold waits
for its placement group, saying what it waits for, and a cancel ends the wait (the reservation
removed, no rank started) as a bounded wait does with a failure. Ray's placement group is faked
at the boundary (`Reservation`); one test asks a real local Ray for a placement group."""

from __future__ import annotations

from pathlib import Path

import pytest

from training import ray_launch
from training.config import RunConfig
from training.distributed import DistributedRunError
from training.events import NullSink
from training.ray_launch import Admission, Cluster, Node, admit, placed, placement_wait_s, unsatisfiable

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = "head:6379"


def _config(hosts: int = 2, gpus: int = 1) -> RunConfig:
    return RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(**{
        "resources.hosts": hosts, "resources.gpus": gpus, "optim.tasks_per_step": hosts * gpus,
    })


def _cluster(*cpus: float, gpus: tuple[float, ...] = (), most: dict[str, float] | None = None) -> Cluster:
    nodes = [Node(id=f"id{i}", name=f"host{i}", resources={"CPU": c, **({"GPU": gpus[i]} if i < len(gpus) else {})})
             for i, c in enumerate(cpus)]
    return Cluster(nodes, most)


class Recorder(NullSink):
    """Keeps the status lines; asks to stop once it has been asked `stop_after` times (None: never)."""

    def __init__(self, stop_after: int | None = None):
        self.events: list[tuple[str, str, str]] = []
        self.stop_after, self.asked = stop_after, 0

    def status(self, phase, detail, *, progress=None, eta=None):
        self.events.append(("status", phase, detail))

    def should_stop(self):
        self.asked += 1
        return self.stop_after is not None and self.asked > self.stop_after


class FakeReservation:
    """A placement group Ray grants after `grant_after` waits (never: None)."""

    def __init__(self, grant_after: int | None, nodes: list[str] | None = None):
        self.grant_after, self.waits, self.removed = grant_after, 0, False
        self.granted_nodes = nodes or ["id0", "id1"]

    def wait(self, timeout_s: float) -> bool:
        self.waits += 1
        return self.grant_after is not None and self.waits > self.grant_after

    def nodes(self) -> list[str]:
        return self.granted_nodes

    def remove(self) -> None:
        self.removed = True


class Clock:
    """Time that moves `tick` seconds each time it is read (each wait of the loop reads it once)."""

    def __init__(self, tick: float = 1.0):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def _admit(config, sink, cluster, reservation, **kw):
    return admit(config, sink, cluster, lambda: reservation, resource=kw.pop("resource", "CPU"), address=ADDRESS,
                 wait_s=kw.pop("wait_s", 60.0), clock=kw.pop("clock", Clock()), **kw)


@pytest.mark.parametrize(
    ("config", "cluster", "resource", "words"),
    [
        (_config(hosts=3), _cluster(1, 1), "CPU", "has 2 CPUs on 2 nodes: it can never start"),
        (_config(hosts=2, gpus=4), _cluster(8, 8, gpus=(4, 2)), "GPU", "needs 8 GPUs (2 hosts x 4), and the Ray cluster at head:6379 has 6 GPUs"),
        (_config(hosts=2), _cluster(4), "CPU", "asks for 2 hosts, and the Ray cluster at head:6379 has 1 node with CPUs (host0)"),
        (_config(hosts=2), _cluster(0, 4), "CPU", "has 1 node with CPUs (host1)"),
        (_config(hosts=4), _cluster(1, most={"CPU": 2}), "CPU", "can grow to 2 CPUs at most"),
    ],
)
def test_it_says_up_front_when_the_cluster_can_never_hold_the_run(config, cluster, resource, words):
    reason = unsatisfiable(config, cluster, resource=resource, address=ADDRESS)
    assert reason is not None and reason.startswith("resources.hosts: ") and words in reason
    reservation = FakeReservation(grant_after=0)
    with pytest.raises(DistributedRunError, match="resources.hosts"):
        _admit(config, Recorder(stop_after=None), cluster, reservation, resource=resource)
    assert reservation.waits == 0, "nothing is reserved for a run that can never start"


def test_a_cluster_that_can_hold_the_run_or_grow_to_it_is_no_problem():
    assert unsatisfiable(_config(hosts=2), _cluster(1, 1), resource="CPU", address=ADDRESS) is None
    assert unsatisfiable(_config(hosts=2, gpus=2), _cluster(8, 8, gpus=(2, 2)), resource="GPU", address=ADDRESS) is None
    assert unsatisfiable(_config(hosts=4), _cluster(1, most={"CPU": 8}), resource="CPU", address=ADDRESS) is None


def test_a_run_waits_for_its_placement_group_and_says_what_it_waits_for():
    sink, reservation = Recorder(stop_after=None), FakeReservation(grant_after=8)
    got = _admit(_config(), sink, _cluster(1, 1), reservation, say_every_s=2.0)
    assert got.nodes == ["id0", "id1"] and not got.cancelled and reservation.removed
    lines = [e for e in sink.events if e[0] == "status"]
    assert lines and all(phase == "waiting" for _, phase, _ in lines)
    assert "Waiting for 2 hosts' CPUs on the Ray cluster (2 ranks x 1 CPU, all at once)" in lines[0][2]
    assert "other work holds them" not in lines[0][2], "not at once: Ray may simply not have answered yet"
    assert "other work holds them" in lines[-1][2], "after a few seconds, it is so"
    assert len(lines) < reservation.waits, "said every few seconds, not at every poll"


def test_a_run_granted_at_once_says_nothing_about_waiting():
    sink = Recorder(stop_after=None)
    assert _admit(_config(), sink, _cluster(1, 1), FakeReservation(grant_after=0)).nodes == ["id0", "id1"]
    assert sink.events == []


def test_cancel_reaches_a_run_waiting_for_its_placement_group():
    sink, reservation = Recorder(stop_after=2), FakeReservation(grant_after=None)
    got = _admit(_config(), sink, _cluster(1, 1), reservation)
    assert got.cancelled and got.nodes == [] and reservation.removed
    assert reservation.waits == 3, "the wait stops at the first poll after the cancel"


def test_a_wait_the_cluster_never_ends_fails_after_the_bound():
    reservation = FakeReservation(grant_after=None)
    with pytest.raises(DistributedRunError, match=r"did not grant the run's 2 CPUs \(2 hosts x 1\) within 30 s \(TROUPE_RAY_PLACEMENT_WAIT_S\)"):
        _admit(_config(), Recorder(stop_after=None), _cluster(1, 1), reservation, wait_s=30.0, clock=Clock(tick=10.0))
    assert reservation.removed


def test_the_wait_bound_comes_from_the_environment_and_a_bad_value_is_named():
    assert placement_wait_s({}) == ray_launch.DEFAULT_PLACEMENT_WAIT_S
    assert placement_wait_s({"TROUPE_RAY_PLACEMENT_WAIT_S": "120"}) == 120.0
    for bad in ("soon", "0", "-5", "inf"):
        with pytest.raises(DistributedRunError, match=f"TROUPE_RAY_PLACEMENT_WAIT_S='{bad}' on the worker is not a positive number"):
            placement_wait_s({"TROUPE_RAY_PLACEMENT_WAIT_S": bad})


def test_the_placed_event_names_the_nodes_and_the_ranks_on_each():
    cluster = _cluster(2, 1)
    where = placed(_config(hosts=2, gpus=1), cluster, Admission(nodes=["id0", "id0", "id1"], waited_s=12.34), resource="CPU", address=ADDRESS)
    assert where == {"launcher": "ray", "address": ADDRESS, "hosts": 2, "ranks": 2, "resource": "CPU",
                     "nodes": {"host0": 2, "host1": 1}, "waited_s": 12.3}


def test_a_run_cancelled_before_any_rank_started_keeps_its_resume_step():
    assert ray_launch._start_step(_config()) == 0
    resumed = _config().replace(**{"checkpoint.resume_from": "/runs/7/checkpoints/step-000010"})
    assert ray_launch._start_step(resumed) == 10


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time on this machine (the suite's other is the e2e's)
def test_a_real_ray_placement_group_is_waited_for_and_removed():
    """The one check against Ray itself: a local one-CPU cluster cannot grant two CPUs (the wait
    times out, the group is removed), and grants one on its node."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        cluster = ray_launch.read_cluster()
        assert len(cluster.nodes) == 1 and cluster.total("CPU") == 1
        too_big = ray_launch.RayReservation({"resources_per_worker": {"CPU": 1}, "num_workers": 2, "placement_strategy": "PACK"}, "too-big")
        assert not too_big.wait(0.5)
        too_big.remove()
        fits = ray_launch.RayReservation({"resources_per_worker": {"CPU": 1}, "num_workers": 1, "placement_strategy": "PACK"}, "fits")
        assert fits.wait(60)
        assert fits.nodes() == [cluster.nodes[0].id]
        fits.remove()
    finally:
        ray.shutdown()
