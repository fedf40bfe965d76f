"""Failures inside a run end it `failed` with a clear message and the traceback on its page, and
leave the process able to take the next run: the real engine on a tiny model, in this process.

Model that fails to load, out of memory, disk full, a plugin reward function raising, a plugin
environment raising."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from django.urls import reverse

from tests.faults.conftest import TINY, TINY_YAML
from tests.webapp.conftest import make_world
from webapp.models import Run
from webapp.runs import services as run_services

pytestmark = pytest.mark.slow


def queue_run(team, *, source: str = "tiny-random:llama", advanced_yaml: str = "", steps: int = 2) -> Run:
    world = make_world(team, source=source)
    config = run_services.run_config_build(topology=world.topology, dataset=world.dataset, name="fault",
                                       overrides={**TINY, "optim.steps": steps}, advanced_yaml=TINY_YAML + advanced_yaml)
    Run.objects.filter(pk=world.run.pk).update(config_yaml=config.to_yaml(), total_steps=steps)
    return world.run


def execute(run: Run) -> Run:
    result = run_services.run_execute(run_id=run.pk, worker="faults@here")
    assert result is not None
    return result


def assert_failed_on_the_page(alice, run: Run, *phrases: str) -> None:
    assert run.status == Run.Status.FAILED, f"{run.status}: {run.error_message}"
    for phrase in phrases:
        assert phrase in run.error_message, run.error_message
    assert run.traceback.startswith("Traceback") and run.finished is not None
    page = alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "Failed:" in page and "Traceback" in page


def test_a_model_that_fails_to_load(alice, tmp_path: Path, settings):
    settings.TROUPE_MODEL_ROOTS = [str(tmp_path / "models")]  # the operator's folder of models
    broken = tmp_path / "models" / "broken-model"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{ this is not json")
    run = execute(queue_run(alice.team, source=f"local:{broken}"))
    assert_failed_on_the_page(alice, run, "[raised in training/")


def test_out_of_memory(alice, monkeypatch):
    import torch

    from training import trainer

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(trainer, "update_policy", oom)
    run = execute(queue_run(alice.team))
    assert_failed_on_the_page(alice, run, "Out of memory (OutOfMemoryError: CUDA out of memory", "micro_batch_size")


def test_a_full_disk(alice, monkeypatch, data_dir):
    from training import checkpoints

    def no_space(policies, folder, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))

    monkeypatch.setattr(checkpoints, "save_policies", no_space)
    run = execute(queue_run(alice.team))
    assert_failed_on_the_page(alice, run, "Disk full (OSError: [Errno 28] No space left on device", str(data_dir))


def test_a_reward_plugin_that_raises(alice):
    run = execute(queue_run(alice.team, advanced_yaml="data: {reward_fn: 'tests.faults.plugins:exploding_reward'}\n"))
    assert_failed_on_the_page(alice, run, "ValueError: reward plugin exploded", "[raised in tests/faults/plugins.py:",
                              "in exploding_reward]")


def test_an_environment_that_raises(alice):
    run = execute(queue_run(alice.team, advanced_yaml="topology: {environment: 'tests.faults.plugins:BrokenEnv'}\n"))
    assert_failed_on_the_page(alice, run, "RuntimeError: environment exploded", "tests/faults/plugins.py:", "in step]")


@pytest.mark.parametrize(("advanced_yaml", "says"), [
    ("topology: {environment: 'tests.faults.plugins:ExitingEnv'}\n", "raised SystemExit: environment called sys.exit"),
    ("data: {reward_fn: 'tests.faults.plugins:interrupting_reward'}\n", "raised KeyboardInterrupt: reward function interrupted"),
])
def test_a_plugin_that_exits_fails_its_run_not_the_worker(alice, advanced_yaml, says):
    run = execute(queue_run(alice.team, advanced_yaml=advanced_yaml))  # SystemExit here would end pytest itself
    assert_failed_on_the_page(alice, run, "PluginCrash:", says, "tests/faults/plugins.py")
    assert "the worker stopped" not in run.error_message
    again = execute(queue_run(alice.team.__class__.objects.create(name="Next"), steps=1))
    assert again.status == Run.Status.SUCCEEDED, again.error_message


def test_the_next_run_still_trains_after_a_failure(alice):
    bad = execute(queue_run(alice.team, advanced_yaml="data: {reward_fn: 'tests.faults.plugins:exploding_reward'}\n"))
    assert bad.status == Run.Status.FAILED
    good = execute(queue_run(bob_team := alice.team.__class__.objects.create(name="Second"), steps=1))
    assert good.status == Run.Status.SUCCEEDED, good.error_message
    assert good.team == bob_team and list(good.metric_points.values_list("step", flat=True)) == [1]
