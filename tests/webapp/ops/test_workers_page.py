"""The workers page: which workers are online, what each runs, and its memory."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from webapp.models import Worker
from webapp.ops import workers


def test_it_requires_login(db):
    response = Client().get(reverse("worker_list"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_it_lists_workers_with_their_state_run_and_memory(alice, alice_world, bob_world):
    now = timezone.now()
    Worker.objects.create(hostname="gpu0@alpha-host", last_seen=now, run=alice_world.run, rss_bytes=3 * 2**30,
                          gpu={"name": "H100", "used": 20 * 2**30, "total": 80 * 2**30, "allocated": 2**30, "reserved": 2**31})
    Worker.objects.create(hostname="gpu1@bravo-host", last_seen=now, run=bob_world.run, rss_bytes=2**30)
    Worker.objects.create(hostname="gpu2@idle-host", last_seen=now, queues="gpu,gpu-x2,gpu-x4,gpu-x8")
    Worker.objects.create(hostname="gpu3@dead-host", last_seen=now - timedelta(minutes=5))
    page = alice.client.get(reverse("worker_list")).content.decode()
    assert page.count("online") >= 3 and "offline" in page
    assert f"#{alice_world.run.pk} first" in page and alice_world.run.get_absolute_url() in page
    assert "another team's run" in page and bob_world.run.get_absolute_url() not in page
    assert "3.0\xa0GB" in page and "20.0\xa0GB / 80.0\xa0GB" in page and "idle" in page
    assert "2 runs queued (1 of your team" in " ".join(page.split())  # both worlds' runs are still queued


def test_it_says_which_queues_each_worker_serves(alice, db):
    Worker.objects.create(hostname="gpu0@local", last_seen=timezone.now(), queues="gpu,gpu-x2,gpu-x4,gpu-x8")
    page = " ".join(alice.client.get(reverse("worker_list")).content.decode().split())
    assert "<code>gpu</code>, <code>gpu-x2</code>, <code>gpu-x4</code>, <code>gpu-x8</code>" in page
    assert "serves the <code>gpu</code> queue" not in page  # a worker serving four queues is not said to serve one
    assert "the queues in its Queues column" in page


def test_it_refreshes_the_table_over_htmx(alice, db):
    Worker.objects.create(hostname="gpu0@a")
    response = alice.client.get(reverse("worker_list"), headers={"HX-Request": "true"})
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="workers"') and "gpu0@a" in body


def test_the_worker_beat_writes_its_row_with_memory(db, settings):
    workers.worker_started(hostname="gpu0@here", queues=["gpu"], pid=123)
    beat = workers.WorkerBeat(hostname="gpu0@here")
    beat.tick()  # one heartbeat, in this thread
    worker = Worker.objects.get(hostname="gpu0@here")
    assert worker.is_online() and worker.queues == "gpu" and worker.rss_bytes > 10 * 2**20
    workers.worker_stopped(hostname="gpu0@here")
    worker.refresh_from_db()
    assert not worker.is_online() and worker.stopped is not None


def test_it_never_initialises_cuda_to_measure_memory():
    import sys

    rss, gpu = workers.process_memory()
    assert rss > 0
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        assert bool(gpu) == torch.cuda.is_initialized()
    else:
        assert gpu == {}


@pytest.mark.gpu
def test_it_reports_gpu_memory_once_the_worker_uses_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA here")
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # 64 MiB
    _, gpu = workers.process_memory()
    assert gpu["name"] and gpu["total"] > gpu["used"] > 0 and gpu["allocated"] >= 64 * 2**20
    del block


def test_it_shows_which_sandbox_layers_a_workers_host_lacks(alice, alice_world):
    workers.worker_started(hostname="gpu0@container", queues=["gpu"], pid=7,
                             sandbox={"user": "uid 1000", "missing": "pidns, netns", "error": "", "seccomp": True},
                             plugin_problems={"environment mypkg.envs:Env": "no module named 'mypkg'"})
    workers.worker_started(hostname="gpu1@full", queues=["gpu"], pid=8, sandbox={"user": "root", "missing": "", "error": ""})
    page = alice.client.get(reverse("worker_list")).content.decode()
    assert "lacks pidns, netns" in page and "as uid 1000" in page
    assert "every layer" in page and "as root" in page
    assert "plugin environment mypkg.envs:Env did not load: no module named &#x27;mypkg&#x27;" in page


def test_the_worker_reports_its_hosts_sandbox_at_start(db, caplog):
    from webapp.celery import _host_report

    with caplog.at_level("INFO", logger="webapp.celery"):
        caps, problems = _host_report("gpu0@here")
    assert caps["error"] == "" and caps["seccomp"] is True and problems == {}
    said = " ".join(r.getMessage() for r in caplog.records)
    assert ("lacks on this host: " + caps["missing"]) in said if caps["missing"] else "the sandbox has every layer" in said


def test_the_workers_page_and_the_run_page_show_a_runs_placement(alice, alice_world):
    from training.config import RunConfig

    config = RunConfig.from_yaml(alice_world.run.config_yaml).replace(**{
        "topology.specialization": "full", "resources.gpus": 3, "resources.parallel": "fsdp",
        "resources.placement": {"tool": 2, "reasoner": 1},
    })
    alice_world.run.config_yaml = config.to_yaml()
    alice_world.run.save(update_fields=["config_yaml"])
    Worker.objects.create(hostname="gpu0@alpha-host", last_seen=timezone.now(), run=alice_world.run)
    alice_world.run.gpus = 3
    alice_world.run.save(update_fields=["gpus"])
    for page in (alice.client.get(reverse("worker_list")), alice.client.get(alice_world.run.get_absolute_url())):
        assert "tool on ranks 0-1 · reasoner on rank 2 (fsdp)" in page.content.decode()
        assert "3 GPUs on one host (fsdp)" in page.content.decode()
