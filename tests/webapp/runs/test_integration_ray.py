"""End to end on two Ray "hosts": a local Ray cluster of two nodes (Ray's `Cluster` utility, one CPU
each), a real Celery worker on the `ray` queue beside its head (TROUPE_RAY_ADDRESS), and a run on
2 hosts created through the run form. Its second node is killed mid-run: the run fails with
the reason; a node joins again, the run is resumed from the run page, and the resumed run
finishes on both nodes with its metrics in the database, after the checkpoint's step.

The variants (refusals, the relay, cancel, failure reasons) are tested in-process in
tests/training/test_ray_launch.py and tests/webapp/runs/test_run_hosts.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.faults.plugins import GATE_VAR
from tests.processes import Processes, wait_for
from tests.webapp.runs.test_integration_worker import broker, redis_url  # noqa: F401 (fixtures)
from webapp.catalog import services as catalog
from webapp.models import Agent, ModelSource, Run

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file `tests.faults.plugins:gated_reward` waits for: each rank holds its second step until
    it exists, so the host dies mid-run however fast the machine is. Set before the nodes start, so
    Ray's workers inherit it."""
    path = tmp_path / "gate-open"
    monkeypatch.setenv(GATE_VAR, str(path))
    return path


@pytest.fixture
def cluster(gate: Path) -> Iterator[Any]:
    """A head node and a second node, one CPU each: a 2-rank run needs both. Ray gives a node 30 s
    to register, which a loaded machine can miss: a node that timed out is started again. Its GCS
    checks the nodes every second (Ray's default: 3 s), so a killed node is known dead after 5
    failed checks in about 5 s, not 15 (a live node still needs 5 checks in a row to go unanswered
    for 10 s each to be taken for dead)."""
    for attempt in range(3):
        try:
            c = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "include_dashboard": False, "_system_config": {"health_check_period_ms": 1000}})
            break
        except Exception as exc:  # noqa: BLE001 (Ray raises a bare Exception for the timeout)
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
    _add_node(c)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        c.shutdown()


def _add_node(c: Any) -> None:
    for attempt in range(3):
        try:
            c.add_node(num_cpus=1)
            break
        except Exception as exc:  # noqa: BLE001
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
    c.wait_for_nodes()


@pytest.fixture
def ray_worker(redis_url: str, data_dir: Path, tmp_path: Path, cluster: Any) -> Iterator[Processes]:  # noqa: F811
    procs = Processes(data_dir=data_dir, log_dir=tmp_path, env={"REDIS_URL": redis_url, "TROUPE_RAY_ADDRESS": cluster.address})
    procs.start_worker("ray", queues="ray")
    try:
        yield procs
    finally:
        procs.stop()


def _wait_finished(run: Run, procs: Processes, what: str) -> Run:
    worker = next(iter(procs.workers.values()))

    def finished() -> bool:
        run.refresh_from_db()
        return not run.is_active

    wait_for(finished, what, 1200, 0.5, proc=worker)
    return run


@pytest.mark.django_db(transaction=True)
def test_a_two_host_run_fails_when_a_host_dies_and_resumes_to_the_end(alice, broker, ray_worker, cluster, gate, settings, tmp_path):  # noqa: F811
    settings.TROUPE_RAY_ADDRESS = cluster.address  # the web's check: this installation names a cluster
    tiny = ModelSource.objects.create(team=alice.team, name="tiny", source="tiny-random:llama")
    tool = Agent.objects.create(team=alice.team, name="tool", role="tool", model_source=tiny)
    reasoner = Agent.objects.create(team=alice.team, name="reasoner", role="reasoner", model_source=tiny)
    topology = catalog.topology_create(team=alice.team, name="tiny duo", environment="math_tool", env_args={"level": 1},
                                        max_turns=2, specialization="lora", agents=[tool, reasoner])
    dataset = catalog.dataset_generator_create(team=alice.team, name="L1", environment="math_tool", env_args={"level": 1},
                                                size=16, eval_size=4)
    response = alice.client.post(reverse("run_new"), {
        "topology": topology.pk, "dataset": dataset.pk, "steps": "12", "k": "2", "tasks_per_step": "2", "lr": "1e-3",
        "lora_r": "4", "max_new_tokens": "8", "temperature": "1.0", "beta": "0", "eval_every": "0",
        "advanced_yaml": "resources: {hosts: 2}\ncheckpoint: {every: 1}\ngeneration: {backend: hf}\n"
                         "data: {reward_fn: 'tests.faults.plugins:gated_reward'}",
    })
    assert response.status_code == 302, response.context["form"].errors
    run = Run.objects.get()
    assert run.hosts == 2 and run.queue_name == "ray"

    # the first checkpoint is in the database and the ranks wait at the gate in step 2: kill the
    # second host, then open the gate (rank 0 goes on, to find its peer gone)
    wait_for(lambda: run.checkpoints.exists() or not Run.objects.get(pk=run.pk).is_active, "the first checkpoint", 1200, 0.5,
             proc=next(iter(ray_worker.workers.values())))
    dead = next(n for n in cluster.worker_nodes)
    cluster.remove_node(dead, allow_graceful=False)
    gate.touch()
    run = _wait_finished(run, ray_worker, "the run to fail")
    assert run.status == Run.Status.FAILED, f"{run.status}: {run.error_message}\n{ray_worker.logs()}"
    assert "a rank of the 2-rank Ray run failed; resume from the last checkpoint" in run.error_message
    checkpoint = run.checkpoints.order_by("-step").first()
    assert checkpoint is not None and 1 <= checkpoint.step < 12
    assert run.metric_points.filter(step=1).exists(), "rank 0's metrics reached the database"

    # a host joins again; the run page's resume queues a run that continues from the checkpoint
    _add_node(cluster)
    t0 = time.monotonic()
    response = alice.client.post(reverse("run_resume", args=[run.pk]))
    resumed = Run.objects.exclude(pk=run.pk).get()
    assert response["Location"] == resumed.get_absolute_url() and resumed.hosts == 2
    resumed = _wait_finished(resumed, ray_worker, "the resumed run to finish")
    assert resumed.status == Run.Status.SUCCEEDED, f"{resumed.status}: {resumed.error_message}\n{ray_worker.logs()}"
    steps = list(resumed.metric_points.order_by("step").values_list("step", flat=True))
    assert steps == list(range(checkpoint.step + 1, 13)), steps
    assert resumed.rollouts.filter(step=12).exists() and resumed.checkpoints.filter(step=12).exists()
    assert resumed.final_metrics and resumed.step == 12
    print(f"resumed at step {checkpoint.step}, finished 12 steps in {time.monotonic() - t0:.0f} s")
