"""A run asking for 2 GPUs (2 CPU processes here) executes through the worker's service: rank 0's
metrics, episodes, evaluations and checkpoint land in the database as a one-process run's do."""

from __future__ import annotations

import pytest

from webapp.models import Run
from webapp.runs import services as run_services

pytestmark = pytest.mark.slow


def test_a_two_process_run_records_the_whole_step(alice_world, data_dir):
    config = run_services.run_config_build(
        topology=alice_world.topology, dataset=alice_world.dataset, name="two gpus",
        overrides={"model.source": "tiny-random:llama", "optim.steps": 2, "optim.tasks_per_step": 2, "resources.gpus": 2,
                   "grpo.k": 2, "generation.max_new_tokens": 8, "eval.every": 2, "eval.size": 4, "checkpoint.every": 0},
    )
    run = Run.objects.create(team=alice_world.run.team, name="two gpus", topology=alice_world.topology, dataset=alice_world.dataset,
                             config_yaml=config.to_yaml(), total_steps=2)
    run = run_services.run_execute(run_id=run.pk, worker="gpu@box")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert list(run.metric_points.order_by("step").values_list("step", flat=True)) == [1, 2]
    assert run.rollouts.filter(step=1).count() == 2  # one task from each process
    assert run.evaluations.count() >= 1 and run.checkpoints.filter(step=2).exists()
