"""How a run executes is decided once (`training.plan`): the worker's engine reports its plan at the
start, the run keeps it, its page shows it as Execution, and the queue the run waited on is the
plan's queue."""

from __future__ import annotations

from pathlib import Path

from django.urls import reverse

from tests.faults.test_run_failures import execute, queue_run
from training.plan import queue_for
from webapp.models import Run


def test_a_run_keeps_the_plan_its_worker_resolved_and_its_page_shows_it(alice):
    run = execute(queue_run(alice.team, steps=1))
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    plan = run.plan
    assert (plan["launcher"], plan["ranks"], plan["backend"], plan["sampler"]) == ("one process", 1, "hf", "off")
    assert plan["queue"] == run.queue_name == queue_for(hosts=run.hosts, gpus=run.gpus) == "gpu"
    assert run.log_lines.filter(message=f"plan: {plan['summary']}").count() == 1  # logged once
    page = alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "<dt>Execution</dt>" in page and "one process on cpu; HF generate; synchronous rollouts; queue gpu" in page


def test_the_plan_names_the_launcher_and_the_queue_of_every_shape_of_run():
    from training.config import RunConfig
    from training.plan import Plan

    base = RunConfig.load(Path(__file__).resolve().parents[3] / "configs" / "tiny-lora.yaml").replace(**{"optim.tasks_per_step": 8})
    shapes = {
        (1, 1, "data"): ("one process", 1, "gpu"),
        (2, 1, "data"): ("torchrun", 2, "gpu-x2"),
        (4, 1, "fsdp"): ("torchrun", 4, "gpu-x4"),
        (2, 2, "data"): ("ray", 4, "ray"),
    }
    for (gpus, hosts, parallel), want in shapes.items():
        plan = Plan.resolve(base.replace(**{"resources.gpus": gpus, "resources.hosts": hosts, "resources.parallel": parallel}), cuda=False)
        assert (plan.launcher, plan.ranks, plan.queue) == want
    threaded = Plan.resolve(base.replace(**{"generation.async": "one_step_off"}), cuda=True)
    assert threaded.sampler == "thread" and "GPU" in threaded.sampler_why
    assert Plan.resolve(base.replace(**{"generation.async": "one_step_off"}), cuda=False).sampler == "process"
